// The beacon: what the probe reports for one request once its body ended (README.md documents
// it field by field; tracer/web/probe/schema.py validates exactly this), and how it leaves the
// page without ever delaying or failing it.
import { serverTimingToken, serverTimingTraceId, traceIdOf } from './trace_context.js';

export const SDK = 'ttftscope-probe/0.1.0';

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
export function beacon(g, rec, model) {
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
export function post(g, fetch, url, body) {
  const nav = g.navigator;
  // text/plain is CORS-safelisted: no preflight, so a cross-origin collector just works.
  const type = 'text/plain;charset=UTF-8';
  if (nav && nav.sendBeacon && nav.sendBeacon(url, new Blob([body], { type }))) return;
  const headers = { 'content-type': type };
  fetch(url, { method: 'POST', keepalive: true, body, headers }).catch(() => {});
}
