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
export const TIMING_HEADER = 'x-ttft-timing';
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
