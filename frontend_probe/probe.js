// Generated from src/ by build.mjs: do not edit (edit src/*.js, then `npm run build`).
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

// ---- src/trace_context.js ----
// The ids and tokens that join a probed request to the server's trace: the W3C traceparent
// the probe sends, the Server-Timing entries the server answers with, and the signed in-band
// timing line of the opt-in stream comment.

const TRACEPARENT = /^[\da-f]{2}-([\da-f]{32})-[\da-f]{16}-[\da-f]{2}$/i;
const SERVER_TIMING_TRACE = /(?:^|,)\s*trace\s*;[^,]*?desc="?([\w-]+)/i;
// The server's HMAC of the trace id (tracer/web/probe/token.py): the beacon returns it as proof.
const SERVER_TIMING_BEACON = /(?:^|,)\s*beacon\s*;[^,]*?desc="?([\da-f]{64})(?![\da-f])/i;
// The opt-in request header and the SSE comment the server answers it with, once, before
// [DONE]: `: ttft-timing <base64url payload>.<base64url HMAC>` (docs/reference.md). Comments
// are ignored by the SSE spec, EventSource and the openai SDKs, so only the probe sees it.
const TIMING_HEADER = 'x-ttft-timing';
const TIMING_COMMENT = /^ ?ttft-timing ([\w-]{1,2000}\.[\w-]{43})$/;

/** A W3C traceparent from `fill` (crypto.getRandomValues); ids are never all zero. */
export function newTraceparent(fill) {
  for (;;) {
    const hex = Array.from(fill(new Uint8Array(24)), b => (b + 256).toString(16).slice(1)).join('');
    const trace = hex.slice(0, 32), span = hex.slice(32);
    if (/[^0]/.test(trace) && /[^0]/.test(span)) return `00-${trace}-${span}-01`;
  }
}

/** The trace id of a traceparent, or null when it is malformed or all zero. */
export function traceIdOf(traceparent) {
  const m = TRACEPARENT.exec(traceparent || '');
  return m && /[^0]/.test(m[1]) ? m[1].toLowerCase() : null;
}

/** The trace id in `Server-Timing: trace;desc=<traceparent>`, or null. */
export function serverTimingTraceId(header) {
  const m = SERVER_TIMING_TRACE.exec(header || '');
  return m && traceIdOf(m[1]);
}

/** The beacon token in `Server-Timing: beacon;desc=<64 hex>`, or null. */
export function serverTimingToken(header) {
  const m = SERVER_TIMING_BEACON.exec(header || '');
  return m ? m[1].toLowerCase() : null;
}

/** The signed token of a `: ttft-timing <token>` comment (text after the ':'), or null. */
export function timingToken(comment) {
  const m = TIMING_COMMENT.exec(comment);
  return m && m[1];
}

// ---- src/beacon.js ----
// The beacon: what the probe reports for one request once its body ended (README.md documents
// it field by field; tracer/web/probe/schema.py validates exactly this), and how it leaves the
// page without ever delaying or failing it.

const SDK = 'ttftscope-probe/0.1.0';

/** Gap statistics in ms; percentiles interpolate linearly, like numpy (vLLM bench's ITL). */
export function itlStats(gaps) {
  const s = [...gaps].sort((a, b) => a - b), n = s.length;
  if (!n) return { count: 0, mean: 0, p50: 0, p95: 0, max: 0 };
  const q = p => {
    const i = (n - 1) * p, lo = Math.floor(i);
    return s[lo] + (s[Math.ceil(i)] - s[lo]) * (i - lo);
  };
  return { count: n, mean: s.reduce((a, b) => a + b) / n, p50: q(0.5), p95: q(0.95), max: s[n - 1] };
}

/** The beacon of a finished request's record; `model` is the install option. */
function beacon(g, rec, model) {
  const resource = resourceTiming(g, rec);
  const b = {
    v: 1,
    trace_id: serverTimingTraceId(rec.serverTiming) || traceIdOf(rec.tp),
    traceparent: rec.tp, url_path: rec.path, status: rec.status, outcome: rec.outcome,
    t: rec.t, chunks: rec.chunks, itl_ms: itlStats(rec.gaps), chunk_ms: rec.cms, input_ms: rec.input, resource,
    probe_errors: rec.errs, sdk: SDK, format: rec.format || null,
  };
  if (model) b.model = model;
  const token = serverTimingToken(rec.serverTiming);
  if (token) b.token = token;
  if (rec.server) b.server = rec.server;
  if (rec.tools?.length) b.tool_calls = rec.tools;
  return b;
}

// The network phases of the request from Resource Timing, or null when the browser has none.
function resourceTiming(g, rec) {
  try {
    const p = g.performance, all = p.getEntriesByName ? p.getEntriesByName(rec.href) : [];
    // a chat page fetches the same URL every turn: take the entry that started closest to us
    let e = null;
    for (const x of all) if (!e || Math.abs(x.startTime - rec.t0) < Math.abs(e.startTime - rec.t0)) e = x;
    // cross-origin without Timing-Allow-Origin zeroes the detail fields
    if (!e || !e.requestStart) return null;
    return {
      dns_ms: e.domainLookupEnd - e.domainLookupStart,
      connect_ms: e.connectEnd - e.connectStart,
      tls_ms: e.secureConnectionStart > 0 ? e.connectEnd - e.secureConnectionStart : 0,
      request_ms: e.responseStart - e.requestStart,
      response_ms: e.responseEnd - e.responseStart,
    };
  } catch (e) {
    rec.errs++;
    return null;
  }
}

/** Posts `body` to `url` by sendBeacon, else by `fetch` (the page's own, unwrapped). */
function post(g, fetch, url, body) {
  const nav = g.navigator;
  // text/plain is CORS-safelisted: no preflight, so a cross-origin collector just works.
  const type = 'text/plain;charset=UTF-8';
  if (nav && nav.sendBeacon && nav.sendBeacon(url, new Blob([body], { type }))) return;
  const headers = { 'content-type': type };
  fetch(url, { method: 'POST', keepalive: true, body, headers }).catch(() => {});
}

// ---- src/event_stream.js ----
// Reading a streamed body as events: bytes to text across UTF-8 boundaries, text to
// text/event-stream (or NDJSON) events across chunk boundaries.

/**
 * Incremental text/event-stream parser: push decoded text as it arrives; `onData` gets each
 * event's data (multi-line `data:` joined by \n), `onComment` each comment line's text after
 * the ':'. `end` flushes a trailing \r line ending. With `ndjson`, each non-blank line is
 * one event's data instead (application/x-ndjson: Ollama).
 *   const push = sseParser(d => console.log(d)); push('data: {"a"'); push(':1}\n\n');
 */
export function sseParser(onData, onComment, ndjson) {
  let buf = '', data = [];
  const line = l => {
    if (ndjson) {
      if (l.trim()) onData(l);
    } else if (!l) {
      if (data.length) onData(data.join('\n'));
      data = [];
    } else if (l[0] == ':') {
      if (onComment) onComment(l.slice(1));
    } else {
      const i = l.indexOf(':'), v = i < 0 ? '' : l.slice(i + 1);
      if ((i < 0 ? l : l.slice(0, i)) == 'data') data.push(v[0] == ' ' ? v.slice(1) : v);
    }
  };
  return (text, end) => {
    buf += text;
    // a \r at the very end may be the first half of a \r\n split across chunks
    const eol = end ? /\r\n?|\n/ : /\r\n|\r(?!$)|\n/;
    for (let m; (m = eol.exec(buf)); buf = buf.slice(m.index + m[0].length)) line(buf.slice(0, m.index));
  };
}

/** feed(bytes) decodes UTF-8 across chunk boundaries into push(text, end); feed() ends it. */
export function utf8Feed(push) {
  const dec = new TextDecoder();
  return bytes => push(bytes ? dec.decode(bytes, { stream: true }) : dec.decode(), !bytes);
}

// ---- src/rules.js ----
// What counts as output in each stream format: the rules that end TTFT (and mark the first
// reasoning and tool call), kept in step with tracer/record/first_content.py.

const ok = s => typeof s == 'string' && s.length > 0;

/**
 * One rule per stream format, tried in this order on a stream's events until one recognises
 * the shape: the stream is then that format (`install({format})` forces one). A rule returns
 * 1 for an event with answer text, 3 for one that names a tool call's function (the call's
 * first delta), 2 for one with reasoning text only (1 wins over 3, 3 over 2), 0 for one of
 * its own events with none (role, start, ping, usage, metadata, tool-call arguments),
 * undefined for any other. A rule may carry `tools(event, rec, ms)`, which keeps `rec.tools`
 * (the beacon's tool_calls: formats.js adds them, OpenAI's too). The core holds OpenAI's;
 * formats.js (a separate add-on, README.md "Stream formats") adds Gemini, Ollama, Responses,
 * Anthropic and the AI SDK UI stream. tracer/record/first_content.py holds the same rules;
 * tests/fixtures/sse/ checks both.
 */
export const RULES = {
  // chat/completions chunks and bodies; reasoning_content (vLLM, DeepSeek) and reasoning
  // (OpenRouter, Ollama's /v1) are reasoning; a tool_calls item or a legacy function_call
  // with a name starts a tool call
  openai: j => Array.isArray(j?.choices) ? j.choices.reduce((k, c, d) => k == 1 ? 1 : (c = c || {}, d = c.delta || {},
    [c.text, d.content, c.message?.content].some(ok) || Math.max(k, [d.tool_calls, c.message?.tool_calls, [{ function: d.function_call }]]
      .some(l => Array.isArray(l) && l.some(x => ok(x?.function?.name))) ? 3 : 2 * [d.reasoning_content, d.reasoning].some(ok))), 0) : undefined,
};

/**
 * Whether a parsed chunk or body carries content, the rule TTFT ends at (the same as
 * tracer/record/first_content.py): ANY choice has a non-empty string in delta.content (chat
 * chunk), text (completions) or message.content (non-streamed body). Role-only, empty, null,
 * usage-only (choices: []), error and reasoning_content-only events don't.
 */
export function hasContent(j) {
  return RULES.openai(j) == 1;
}

// ---- src/probe.js ----
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
