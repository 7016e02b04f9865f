// ttftscope browser probe: measures client-side TTFT on streamed LLM responses and reports
// it, with the W3C trace id, to the tracer. Zero dependencies; build.mjs makes the one-file
// module probe.js and the classic <script> build (probe.global.js, window.TTFTProbe) from
// src/ (this file and what it imports).
//
// Usage:
//   import { TTFTProbe } from './probe.js';
//   TTFTProbe.install({ collector: '/v1/probe', sampleRate: 0.1 });
//   // every fetch to .../chat/completions or .../completions is now traced
//   TTFTProbe.install({ match: '/api/chat' });   // an AI SDK route, Anthropic, Ollama...
//
// Stream formats (`format` in the beacon, a closed set: the names of RULES, 'text', 'custom'):
// the first event with answer text ends TTFT, by the rule of the format the response turned
// out to be (RULES in src/rules.js and in the add-on formats.js; README.md, "Stream formats").
// Reasoning text and tool calls are kept apart (t.first_reasoning, t.first_tool_call): the
// first output is the earliest of the three, its kind the field's; with the add-on,
// `tool_calls` lists each call's function name and its start and ready (arguments complete)
// times, never arguments.
//
// Beacon: one JSON POST to `collector` per probed request, after the stream ends, fails or
// is aborted (README.md documents it field by field; the tracer validates exactly this):
// { "v": 1, "trace_id": "<32 hex>", "traceparent": "00-<32 hex>-<16 hex>-01",
//   "url_path": "/v1/chat/completions", "status": 200 | null, "outcome": "ok" | "http_error"
//   | "aborted" | "network_error",
//   "t": { "start": 0, "headers": ms|null, "first_byte": ms|null, "first_token": ms|null,
//          "first_paint": ms|null, "end": ms, "first_reasoning"?: ms, "first_tool_call"?: ms },
//   "tool_calls"?: [{ "name": "<function, <= 64 chars>", "start": ms, "ready": ms|null }] (<= 8),
//   "format": "openai" | "ai-sdk-ui" | "text" | "openai-responses" | "anthropic" | "ollama"
//     | "gemini" | "custom" | null (the stream's format; null: none recognised),
//   "chunks": n, "itl_ms": { "count": n, "mean": ms, "p50": ms, "p95": ms, "max": ms },
//   "chunk_ms": [ms, ...] (arrival of the first 32 content chunks, like t.*),
//   "input_ms": ms|null (markInput() -> fetch()),
//   "resource": { "dns_ms", "connect_ms", "tls_ms", "request_ms", "response_ms" } | null,
//   "probe_errors": n, "sdk": "ttftscope-probe/0.1.0", "model"?: "<install option>",
//   "token"?: "<64 hex: Server-Timing beacon;desc, required by the server for a trace id>",
//   "server"?: "<the server's signed in-band timing: the `: ttft-timing <token>` SSE comment>" }

import { beacon, post, SDK } from './beacon.js';
import { sseParser, utf8Feed } from './event_stream.js';
import { RULES } from './rules.js';
import { newTraceparent, TIMING_HEADER, timingToken } from './trace_context.js';

export { itlStats } from './beacon.js';
export { sseParser, utf8Feed } from './event_stream.js';
export { hasContent, RULES } from './rules.js';
export { newTraceparent, serverTimingToken, serverTimingTraceId, timingToken, traceIdOf } from './trace_context.js';

const DEFAULT_PATH = /\/(chat\/)?completions$/;
// Hidden tabs never run animation frames: the beacon waits at most this long for the paint.
const PAINT_WAIT_MS = 200;
// Arrival times of this many content chunks go in the beacon (the server's bound too).
const MAX_CHUNK_TIMES = 32;
// A markInput() older than this did not lead to the next request (e.g. a rejected form).
const INPUT_MAX_AGE_MS = 60000;

/**
 * A probe bound to one global object (window by default); tests pass a fake one holding
 * fetch, performance, requestAnimationFrame, setTimeout, navigator.sendBeacon, crypto, location.
 *   const probe = createProbe({ global: fakeWindow, random: () => 0 });
 *   probe.install({ sampleRate: 1 });
 */
export function createProbe(env = {}) {
  const g = env.global || globalThis;
  const random = env.random || Math.random;
  const now = () => g.performance.now();
  const timer = (f, ms) => g.setTimeout(f, ms);
  let opts = {}, native = null, inputAt = null;

  function matches(raw, abs) {
    const m = opts.match;
    if (m == null) return abs.origin == new URL(base()).origin && DEFAULT_PATH.test(abs.pathname);
    if (typeof m == 'string') return [raw, abs.href, abs.pathname].some(s => s.startsWith(m));
    return m instanceof RegExp ? m.test(abs.href) : !!m(abs.href);
  }
  const base = () => (g.location ? g.location.href : 'http://localhost/');

  // The request's record and its init with a traceparent, or undefined when not probed.
  function begin(input, init, explicit) {
    const raw = (typeof input == 'object' && input.url) || String(input);
    const abs = new URL(raw, base());
    if (!explicit && !matches(raw, abs)) return;
    // the next matching fetch takes the mark, sampled or not, so a later one never reuses it
    const mark = inputAt;
    inputAt = null;
    if (!(random() < (opts.sampleRate == null ? 1 : opts.sampleRate))) return;
    const headers = new Headers(init && init.headers !== undefined ? init.headers : input.headers);
    let tp = headers.get('traceparent');
    if (!tp) headers.set('traceparent', (tp = newTraceparent(a => g.crypto.getRandomValues(a))));
    // a non-safelisted header: cross-origin, the preflight must allow it (README)
    if (opts.timing !== false && !headers.has(TIMING_HEADER)) headers.set(TIMING_HEADER, '1');
    const t = { start: 0, headers: null, first_byte: null, first_token: null, first_paint: null, end: null };
    const rec = { tp, t, path: abs.pathname, href: abs.href, status: null, chunks: 0, gaps: [], cms: [], errs: 0 };
    rec.t0 = now();
    rec.input = mark != null && rec.t0 - mark < INPUT_MAX_AGE_MS ? rec.t0 - mark : null;
    return [{ ...init, headers }, rec];
  }

  function probeFetch(input, init, explicit) {
    const f = native || g.fetch;
    let probed;
    try {
      probed = begin(input, init, explicit);
    } catch (e) {
      // a bad input makes the native fetch reject on its own: let it, untouched
    }
    return probed ? run(f, input, probed[0], probed[1]) : f(input, init);
  }

  async function run(f, input, init, rec) {
    let res;
    try {
      res = await f(input, init);
    } catch (e) {
      finish(rec, e && e.name == 'AbortError' ? 'aborted' : 'network_error');
      throw e;
    }
    try {
      return observe(res, rec);
    } catch (e) {
      rec.errs++;
      finish(rec, res.ok ? 'ok' : 'http_error');
      return res;
    }
  }

  // Hands the app a Response fed by an eager pump, so the probe sees every chunk the moment
  // it arrives and never delays the app; the app cancelling its body cancels the network read.
  function observe(res, rec) {
    rec.t.headers = now() - rec.t0;
    rec.status = res.status;
    rec.serverTiming = res.headers.get('server-timing');
    if (!res.body) return finish(rec, res.ok ? 'ok' : 'http_error'), res;
    let ctl, reader, cancelled = false;
    const out = new Response(new ReadableStream({
      start: c => void (ctl = c),
      cancel: r => ((cancelled = true), reader.cancel(r)),
    }), res);
    for (const k of ['url', 'redirected', 'type']) Object.defineProperty(out, k, { value: res[k] });
    reader = res.body.getReader();
    const feed = consumer(res, rec);
    (async () => {
      let outcome = 'ok';
      try {
        for (let r; !(r = await reader.read()).done; ) {
          if (!cancelled) ctl.enqueue(r.value);
          feed(r.value);
        }
        if (!cancelled) ctl.close();
      } catch (e) {
        outcome = e && e.name == 'AbortError' ? 'aborted' : 'network_error';
        if (!cancelled) ctl.error(e);
      }
      feed();
      // the openai SDKs cancel the body once they read [DONE]: that answer was complete
      finish(rec, cancelled && !rec.done ? 'aborted' : res.ok ? outcome : 'http_error');
    })();
    return out;
  }

  // Returns feed(bytes) for each body chunk and feed() at the end; it never throws. How the
  // body is read follows what arrived (or the forced format): text/plain is text, each
  // non-empty decoded piece content; NDJSON is an event a line; other JSON is one body (a
  // non-streamed answer); the rest is SSE. isContent gets each event (the text, for text).
  function consumer(res, rec) {
    const type = res.headers.get('content-type') || '', custom = opts.isContent, forced = opts.format;
    const plain = forced ? forced == 'text' : /^text\/plain/i.test(type);
    rec.format = custom ? 'custom' : forced || (plain ? 'text'
      : res.headers.get('x-vercel-ai-ui-message-stream') ? 'ai-sdk-ui' : null);
    const event = d => {
      let j, f = rec.format, k, t = now() - rec.t0;
      try {
        j = JSON.parse(d);
        if (custom) k = custom(j) ? 1 : 0;
        else if (f) k = RULES[f]?.(j);
        // the first event whose shape a rule recognises decides the format
        else for (f in RULES) if ((k = RULES[f](j)) != null) break;
      } catch (e) {
        return rec.errs++;
      }
      if (k != null) rec.format = f;
      // a rule's string is the engine's signed timing (formats.js: server.js's AI SDK data part)
      if (typeof k == 'string') return rec.server = k;
      if (k == 1) content(rec);
      // t.first_reasoning (2), t.first_tool_call (3): the first of each
      else if (k > 1 && rec.t[f = k > 2 ? 'first_tool_call' : 'first_reasoning'] == null) rec.t[f] = t;
      // each tool call's start and ready times (formats.js), by the stream's format's rule
      if (k != null) RULES[rec.format]?.tools?.(j, rec, t);
    };
    let body = '';
    const nd = /ndjson|jsonl/i.test(type), events = sseParser(data => data == '[DONE]' ? (rec.done = true) : event(data),
      // the last one wins: the line nearest [DONE] comes from the hop nearest the browser
      c => (rec.server = timingToken(c) || rec.server), nd);
    const decode = utf8Feed(plain ? text => text && (!custom || custom(text)) && content(rec)
      : !nd && /json/i.test(type) ? (text, end) => {
        body += text;
        // a non-streamed answer's first token is when the whole body has been parsed
        if (end && res.ok) event(body);
      } : events);
    return bytes => {
      try {
        if (bytes && bytes.length && rec.t.first_byte == null) rec.t.first_byte = now() - rec.t0;
        decode(bytes);
      } catch (e) {
        rec.errs++;
      }
    };
  }

  function content(rec) {
    const t = now() - rec.t0;
    if (rec.t.first_token == null) {
      rec.t.first_token = t;
      const paint = () => {
        rec.t.first_paint = now() - rec.t0;
        if (rec.painted) rec.painted();
      };
      g.requestAnimationFrame ? g.requestAnimationFrame(paint) : timer(paint, 0);
    } else rec.gaps.push(t - rec.last);
    if (rec.cms.length < MAX_CHUNK_TIMES) rec.cms.push(t);
    rec.last = t;
    rec.chunks++;
  }

  function finish(rec, outcome) {
    try {
      rec.outcome = outcome;
      rec.t.end = now() - rec.t0;
      const go = () => rec.sent || ((rec.sent = true), send(rec));
      // one macrotask later, so the Resource Timing entry (added once the body ended) exists
      if (rec.t.first_token != null && rec.t.first_paint == null) {
        rec.painted = () => timer(go, 0);
        timer(go, PAINT_WAIT_MS);
      } else timer(go, 0);
    } catch (e) {
      // nothing left to report with
    }
  }

  function send(rec) {
    try {
      post(g, native || g.fetch, opts.collector || '/v1/probe', JSON.stringify(beacon(g, rec, opts.model)));
    } catch (e) {
      // the page must never see a probe failure
    }
  }

  const api = {
    version: SDK,
    /** The format rules (RULES): formats.js adds its own here. */
    rules: RULES,
    /** Wraps the global fetch (once; later calls only replace the options). */
    install(o) {
      o = o || {};
      const f = o.format;
      // an unknown format (or one of formats.js not loaded) would find no first token: refuse
      // it, keeping the options in force
      if (f && !(RULES[f] || f == 'text' || f == 'custom' && o.isContent)) throw new TypeError('TTFTProbe: format ' + f);
      opts = o;
      if (!native) {
        const orig = (native = g.fetch);
        // if another wrapper was installed on top of ours, uninstall turns ours into a pass-through
        g.fetch = function fetch(input, init) {
          return native === orig ? probeFetch(input, init, false) : orig(input, init);
        };
        api.wrapper = g.fetch;
      }
      return api;
    },
    uninstall() {
      if (native && g.fetch === api.wrapper) g.fetch = native;
      native = null;
    },
    /** The user just asked (pressed Enter): the next probed fetch reports input_ms from now. */
    markInput() {
      inputAt = now();
    },
    /** fetch() that is always probed (subject to sampleRate), whatever `match` says. */
    fetch: (input, init) => probeFetch(input, init, true),
  };
  return api;
}

export const TTFTProbe = createProbe();
