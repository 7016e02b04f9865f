// A fake browser global for the probe's tests: a settable clock, scripted response bodies,
// recorded animation frames, timers and beacons. Nothing here reads wall time.
//   const b = fakeBrowser({ respond: () => b.sse([{ at: 5, data: 'data: {}\n\n' }]) });
//   const probe = createProbe({ global: b.global });
//   const res = await probe.fetch('/v1/chat/completions', {});
//   const beacon = await b.nextBeacon();
import { webcrypto } from 'node:crypto';

export const T0 = 1000;
const enc = new TextEncoder();

export const sseEvent = obj => `data: ${JSON.stringify(obj)}\n\n`;
export const delta = content => sseEvent({ choices: [{ index: 0, delta: { content } }] });
export const roleOnly = () => sseEvent({ choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] });

export function concatBytes(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let i = 0;
  for (const c of chunks) out.set(c, (i += c.length) - c.length);
  return out;
}

export async function readAll(res) {
  const chunks = [], reader = res.body.getReader();
  for (let r; !(r = await reader.read()).done; ) chunks.push(r.value);
  return concatBytes(chunks);
}

/**
 * options: respond(input, init) -> Response (may throw or reject); headersAt: clock when
 * fetch resolves; raf: whether requestAnimationFrame exists; sendBeacon: whether it exists
 * (or a function); entries: Resource Timing entries; random: bytes source for crypto;
 * hidden: no animation frame ever runs.
 */
export function fakeBrowser(options = {}) {
  const clock = { t: T0 };
  const frames = [], delayed = [], timerDelays = [], beacons = [], fetches = [], waiters = [];
  const deliver = b => (waiters.length ? waiters.shift()(b) : beacons.push(b));
  const recordBeacon = async (url, body, via) => deliver({ url, via, json: JSON.parse(await body) });
  const runFrames = () => frames.splice(0).forEach(f => f(clock.t));
  const global = {
    performance: {
      now: () => clock.t,
      getEntriesByName: name => (options.entries || []).filter(e => e.name === name),
    },
    setTimeout(f, ms) {
      // zero-delay timers run as real macrotasks: after every microtask-driven stream step
      timerDelays.push(ms);
      if (ms) delayed.push(f);
      else setImmediate(f);
    },
    crypto: { getRandomValues: options.random || (a => webcrypto.getRandomValues(a)) },
    navigator: {},
    async fetch(input, init) {
      fetches.push({ input, init });
      if (init && init.keepalive) return recordBeacon(String(input), init.body, 'fetch'), new Response(null, { status: 204 });
      const res = await options.respond(input, init);
      clock.t = options.headersAt ?? T0 + 2;
      return res;
    },
  };
  // frames run at a script's `frame` steps; a visible tab also renders one at the next
  // macrotask (after every microtask-driven stream step), a hidden tab never does
  if (options.raf !== false) global.requestAnimationFrame = f => frames.push(f) && !options.hidden && setImmediate(runFrames);
  const sb = options.sendBeacon;
  if (sb !== false) {
    global.navigator.sendBeacon = typeof sb == 'function' ? sb : (url, blob) => (recordBeacon(url, blob.text(), 'sendBeacon'), true);
  }

  /** A Response whose body is pulled step by step; each step sets the clock first. */
  function scripted(steps, { status = 200, headers = { 'content-type': 'text/event-stream' }, signal } = {}) {
    let i = 0, ctl, aborted = false;
    const cancels = [];
    const stream = new ReadableStream({
      start: c => void (ctl = c),
      pull(c) {
        for (let s; (s = steps[i++]); ) {
          if (s.at != null) clock.t = T0 + s.at;
          if (s.run) s.run();
          if (aborted) return;
          if (s.frame) runFrames();
          if (s.error) return c.error(s.error);
          if (s.data != null) return c.enqueue(typeof s.data == 'string' ? enc.encode(s.data) : s.data);
        }
        c.close();
      },
      cancel: r => void cancels.push(r),
    }, { highWaterMark: 0 });
    // what a browser does to the body of an aborted fetch
    if (signal) signal.addEventListener('abort', () => {
      aborted = true;
      ctl.error(new DOMException('aborted', 'AbortError'));
    });
    const res = new Response(stream, { status, statusText: status == 200 ? 'OK' : 'Oops', headers });
    res.cancels = cancels;
    return res;
  }

  return {
    global, clock, frames, delayed, timerDelays, fetches,
    sse: (steps, opts) => scripted(steps, opts),
    runDelayed: () => delayed.splice(0).forEach(f => f()),
    beaconsSoFar: () => beacons.slice(),
    nextBeacon: () => (beacons.length ? Promise.resolve(beacons.shift()) : new Promise(r => waiters.push(r))),
  };
}
