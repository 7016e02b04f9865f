// ttftscope server-side helper for a Node web backend that calls the engine and writes a
// stream of its own (the AI SDK's streamText, a proxy that rewrites events): it keeps the
// browser's trace joined to the engine's. Zero dependencies; Web-standard fetch, Request,
// Response and streams (Node >= 20, Next.js route handlers, Hono, Express through writeTo).
//
//   import { ttftJoin } from '@ttftscope/probe/server.js';
//   export async function POST(req) {                       // e.g. a Next.js route
//     const join = ttftJoin(req);                           // the browser's request
//     const openai = createOpenAI({ baseURL: ENGINE, fetch: join.fetch });
//     const result = streamText({ model: openai.chat('smollm2'), messages });
//     return join.respond(result.toUIMessageStreamResponse());
//   }
//
// Three things, each what the engine and the probe already speak (docs/reference.md, "The
// in-band timing line"; docs/backends.md, "Behind your web backend"):
// 1. join.fetch forwards the browser's `traceparent` (when valid W3C Trace Context),
//    `tracestate` (only with it) and `X-TTFT-Timing` on the backend's own call to the engine:
//    a `fetch` for the AI SDK providers' and the openai / @anthropic-ai/sdk clients' `fetch`
//    option. It reads, without changing a byte, the engine's `Server-Timing` and its signed
//    `: ttft-timing <token>` SSE comment.
// 2. join.respond(response) copies that Server-Timing onto the backend's response (it waits
//    for the engine's response headers, at most `waitMs`), and
// 3. hands the token to the outgoing stream right before its `data: [DONE]` (or at its end):
//    as an SSE comment in an SSE stream, or, in the AI SDK UI message stream, as the data part
//    {"type":"data-ttft-timing","data":"<token>","transient":true} (join.part() gives it, for
//    a createUIMessageStream writer). The probe reads both; the AI SDK's Chat ignores the
//    comment and passes a transient data part to onData only. A text/plain stream has no
//    place for it: there the beacon carries the Server-Timing alone.
// The collector's join is unchanged: the token is still the engine's, signed by it.
// 4. With `beaconKey` (the key the collector was given, `--beacon-key`), the backend signs the
//    beacon token itself, as the engine and the proxy do (tracer/web/probe/token.py): its
//    response says `Server-Timing: trace;desc=<traceparent>, beacon;desc=<hex HMAC-SHA256(key,
//    trace id)>` and exposes Server-Timing to the page (docs/backends.md, "Signing the beacon
//    in the backend"). No ttftscope component need then be in the data path.

import { beaconToken, exposeServerTiming, withoutJoinMetrics } from './server_signing.js';

export { beaconToken, exposeServerTiming };

/** The request headers the engine needs from the browser's request. */
export const FORWARD = ['traceparent', 'tracestate', 'x-ttft-timing'];
/** The AI SDK UI message stream's response header (ai 7.0.173, UI_MESSAGE_STREAM_HEADERS). */
export const UI_STREAM_HEADER = 'x-vercel-ai-ui-message-stream';
// `: ttft-timing <base64url payload>.<base64url HMAC>` (tracer/web/inband.py), the probe's rule.
const TIMING_COMMENT = /^: ?ttft-timing ([\w-]{1,2000}\.[\w-]{43})$/;
// Lines longer than this are never the timing comment: the tap keeps no more of a line.
const MAX_TAP_LINE = 2200;
const DEFAULT_WAIT_MS = 10000;

// RFC 9110, "Field Names" (a token) and "Field Values" (never CR, LF or NUL): what Headers
// refuses by throwing, which would end the backend's request over one header it never needed.
const FIELD_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const NOT_IN_VALUES = /[\r\n\0]/;

function refusal(name, why) {
  const error = new TypeError(`ttftscope server.js: header "${name}" refused: ${why}`);
  error.header = name;
  return error;
}

/**
 * The headers of a Fetch Request, a Headers, a Node IncomingMessage or a plain object. A
 * plain object's header that no HTTP message may carry is left out, and `onRefused` gets a
 * TypeError saying which and why (its `header` is the name).
 */
export function headersOf(source, onRefused = () => {}) {
  const h = source && source.headers !== undefined ? source.headers : source;
  if (h && typeof h.get == 'function') return h;
  const out = new Headers();
  for (const [k, v] of Object.entries(h || {})) {
    const value = typeof v == 'string' ? v : Array.isArray(v) ? v.join(', ') : null;
    if (value == null) continue;
    if (!FIELD_NAME.test(k)) onRefused(refusal(k, 'not a valid field name (RFC 9110, "Field Names")'));
    else if (NOT_IN_VALUES.test(value)) {
      onRefused(refusal(k, 'its value has CR, LF or NUL, which no field value may carry (RFC 9110, "Field Values")'));
    } else {
      try {
        out.set(k, value);
      } catch (e) {
        onRefused(refusal(k, e.message));
      }
    }
  }
  return out;
}

const TRACEPARENT_00 = /^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})/;
const ALL_ZERO = /^0+$/;

/**
 * The `traceparent` to send on, as W3C Trace Context (Level 2, "traceparent Header") reads
 * it, or null when invalid: lowercase hex; version `ff` invalid; version 00 exactly 55
 * characters; all-zero trace and parent ids invalid. A later version is read by its
 * "Versioning of traceparent" rules (at least 55 characters, the version-00 fields, then the
 * end or a `-`) and, as they require, sent on in the highest version known here: 00, with
 * the sampled bit of its flags (the only bit those rules read).
 */
export function traceparentOf(value) {
  if (typeof value != 'string' || value.length < 55) return null;
  const version = value.slice(0, 2), m = TRACEPARENT_00.exec(value);
  if (!m || version == 'ff' || ALL_ZERO.test(m[1]) || ALL_ZERO.test(m[2])) return null;
  if (version == '00') return value.length == 55 ? value : null;
  if (value.length > 55 && value[55] != '-') return null;
  return `00-${m[1]}-${m[2]}-${parseInt(m[3], 16) & 1 ? '01' : '00'}`;
}

/**
 * The `Server-Timing` value that tells the probe the server span's context and the beacon
 * token (tracer/record/traceparent.py `server_timing_value`), or null when `traceparent` is
 * not valid W3C Trace Context.
 */
export function signedServerTiming(traceparent, key) {
  const tp = traceparentOf(traceparent);
  return tp && `trace;desc=${tp}, beacon;desc=${beaconToken(key, tp.slice(3, 35))}`;
}

/** What goes to the engine from the browser's headers: [name, value] pairs. A tracestate
 * goes only with a valid traceparent (without one, no receiver may read it). */
function forwardable(incoming) {
  const out = [], traceparent = traceparentOf(incoming.get('traceparent'));
  if (traceparent) out.push(['traceparent', traceparent], ['tracestate', incoming.get('tracestate')]);
  out.push(['x-ttft-timing', incoming.get('x-ttft-timing')]);
  return out.filter(([, value]) => value);
}

/**
 * A line reader over a byte stream: `onLine(text)` for each line ended by \r\n, \r or \n
 * (a \r\n split across reads gives one extra empty line: harmless, only comments matter),
 * keeping at most MAX_TAP_LINE characters of an unfinished one.
 */
function lineTap(onLine) {
  const dec = new TextDecoder();
  let buf = '', skipping = false;
  return bytes => {
    const parts = (bytes ? dec.decode(bytes, { stream: true }) : dec.decode()).split(/\r\n|\r|\n/);
    for (const part of parts.slice(0, -1)) {
      if (!skipping) onLine(buf + part);
      buf = '';
      skipping = false;
    }
    if (!skipping) buf += parts[parts.length - 1];
    if (buf.length > MAX_TAP_LINE) (buf = ''), (skipping = true);
  };
}

/** A copy of `body` that calls `onLine` with each line as the bytes pass, unchanged. */
function tapped(body, onLine) {
  const feed = lineTap(onLine);
  return body.pipeThrough(new TransformStream({
    transform(chunk, ctl) {
      ctl.enqueue(chunk);
      try {
        feed(chunk);
      } catch (e) {
        // a tap must never break the engine's stream
      }
    },
  }));
}

const DONE = /^data: ?\[DONE\]$/;
const mayBeDone = l => ['data: [DONE]', 'data:[DONE]'].some(d => d.startsWith(l));

/**
 * `body` (an SSE stream) with `event()`'s text (or nothing, when it gives none) written once,
 * as its own event: right before the `data: [DONE]` event, else at the end (when the stream
 * ended between events, as the engine does). Every byte passes on as it comes, except a line
 * that may still become `data: [DONE]`, held until it is known (at most 12 characters).
 */
function injected(body, event) {
  const enc = new TextEncoder(), dec = new TextDecoder();
  let held = '', atStart = true, lineStarted = false, cr = false, written = false;
  const once = () => {
    const text = written ? '' : event() || '';
    if (text) written = true;
    return text;
  };
  const eol = /\r\n|\r|\n/g;
  const pass = text => {
    let out = '', i = 0;
    eol.lastIndex = 0;
    for (let m; (m = eol.exec(text)); i = eol.lastIndex) {
      const line = text.slice(i, m.index);
      // the \n of a \r\n that the reads split: not a line of its own
      if (cr && i == 0 && m.index == 0 && m[0] == '\n') {
        out += '\n';
        cr = false;
        continue;
      }
      if (!lineStarted && atStart && DONE.test(line)) out += once();
      out += line + m[0];
      atStart = !lineStarted && line == '';
      lineStarted = cr = false;
    }
    cr = text.endsWith('\r');
    const rest = text.slice(i);
    if (rest && !lineStarted && atStart && !written && mayBeDone(rest)) held = rest;
    else if (rest) (out += rest), (lineStarted = true);
    return out;
  };
  return body.pipeThrough(new TransformStream({
    transform(chunk, ctl) {
      const text = held + dec.decode(chunk, { stream: true });
      held = '';
      const out = pass(text);
      if (out) ctl.enqueue(enc.encode(out));
    },
    flush(ctl) {
      const rest = held + dec.decode();
      const out = !lineStarted && atStart && (!rest || DONE.test(rest)) ? once() + rest : rest;
      if (out) ctl.enqueue(enc.encode(out));
    },
  }));
}

/**
 * The join for one browser request. `options.fetch` is the fetch the backend would use
 * (default: globalThis.fetch); `options.waitMs` bounds how long respond() waits for the
 * engine's response headers (default 10 s; the engine sends them before its first token);
 * `options.onRefused(error)` hears of each of the request's headers left out (`join.refused`
 * lists them too): never thrown, the backend's request goes on without it.
 * `options.beaconKey` (string or bytes, the collector's `--beacon-key`): respond() signs the
 * beacon token for the trace of `options.traceparent` (the backend's own server span's, e.g.
 * from `propagation.inject`; when absent or invalid, the browser's incoming one), puts
 * `trace;desc=..., beacon;desc=...` first in Server-Timing in place of the engine's, and adds
 * Server-Timing to Access-Control-Expose-Headers.
 */
export function ttftJoin(request, options = {}) {
  const refused = [];
  const incoming = headersOf(request, error => {
    refused.push(error);
    if (options.onRefused) options.onRefused(error);
  });
  const outgoing = forwardable(incoming), base = options.fetch || globalThis.fetch;
  const waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
  const signed = options.beaconKey == null ? null
    : signedServerTiming(options.traceparent, options.beaconKey)
      || signedServerTiming(incoming.get('traceparent'), options.beaconKey);
  let serverTiming = null, token = null, answered;
  const engineAnswered = new Promise(r => (answered = r));

  async function fetch(input, init) {
    const headers = new Headers(init && init.headers !== undefined ? init.headers
      : input instanceof Request ? input.headers : undefined);
    for (const [name, value] of outgoing) if (!headers.has(name)) headers.set(name, value);
    let res;
    try {
      res = await base(input, { ...init, headers });
    } catch (e) {
      answered();
      throw e;
    }
    // the first engine response is the one the browser's request is about
    if (serverTiming == null) serverTiming = res.headers.get('server-timing');
    answered();
    if (!res.body) return res;
    const body = tapped(res.body, l => {
      const m = TIMING_COMMENT.exec(l);
      if (m && token == null) token = m[1];
    });
    const out = new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
    // what the clients read besides the body (the openai SDK reads url in its errors)
    for (const k of ['url', 'redirected', 'type']) Object.defineProperty(out, k, { value: res[k] });
    return out;
  }

  const join = {
    fetch,
    /** The browser's headers left out as no HTTP message may carry them (TypeErrors). */
    refused,
    /** What respond() puts first in Server-Timing with a beaconKey (else null). */
    signedServerTiming: signed,
    /** The engine's Server-Timing header, once its response came (else null). */
    get serverTiming() {
      return serverTiming;
    },
    /** The engine's signed timing token, once its stream carried it (else null). */
    get token() {
      return token;
    },
    /** The AI SDK UI message stream data part with the token, or null before it came. */
    part() {
      return token && { type: 'data-ttft-timing', data: token, transient: true };
    },
    /**
     * `response` (the backend's own) with the engine's Server-Timing added and, in an SSE
     * body, the token written before `data: [DONE]`. Resolves once the engine answered (or
     * failed, or waitMs passed).
     */
    async respond(response) {
      let timer;
      await Promise.race([engineAnswered, new Promise(r => (timer = setTimeout(r, waitMs)))]);
      clearTimeout(timer);
      const headers = new Headers(response.headers);
      if (signed) {
        const rest = [headers.get('server-timing'), serverTiming].filter(Boolean).map(withoutJoinMetrics);
        headers.set('server-timing', [signed, ...rest].filter(Boolean).join(', '));
        exposeServerTiming(headers);
      } else if (serverTiming) headers.append('server-timing', serverTiming);
      const sse = /^text\/event-stream/i.test(headers.get('content-type') || '');
      const ui = !!headers.get(UI_STREAM_HEADER);
      const event = () => token && (ui ? `data: ${JSON.stringify(join.part())}\n\n` : `: ttft-timing ${token}\n\n`);
      const body = sse && response.body ? injected(response.body, event) : response.body;
      return new Response(body, { status: response.status, statusText: response.statusText, headers });
    },
  };
  return join;
}

/**
 * Writes a Web Response to a Node ServerResponse (Express, node:http) as it streams; a client
 * that goes away cancels the body, so the engine's generation stops too.
 */
export async function writeTo(nodeRes, response) {
  nodeRes.statusCode = response.status;
  response.headers.forEach((v, k) => nodeRes.setHeader(k, v));
  nodeRes.flushHeaders();
  if (!response.body) return void nodeRes.end();
  const reader = response.body.getReader();
  nodeRes.on('close', () => reader.cancel().catch(() => {}));
  try {
    for (let r; !(r = await reader.read()).done; ) nodeRes.write(r.value);
  } finally {
    nodeRes.end();
  }
}
