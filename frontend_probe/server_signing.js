// ttftscope server-side helper, the signing half: the beacon token a backend signs with the
// collector's key when no ttftscope server is in the data path (docs/backends.md, "Signing
// the beacon in the backend"), and the Server-Timing header rules around it. Zero
// dependencies (node:crypto). server.js uses and re-exports it.

import { createHmac } from 'node:crypto';

/**
 * The beacon token for `traceId` (32 lowercase hex digits): hex(HMAC-SHA256(key, trace id as
 * ASCII)), what tracer/web/probe/token.py `BeaconSigner(key).token(trace_id)` gives. A string
 * key is taken as UTF-8, as the collector's `--beacon-key` is.
 */
export function beaconToken(key, traceId) {
  if (!(typeof key == 'string' || key instanceof Uint8Array) || key.length == 0) {
    throw new TypeError('ttftscope server.js: a beacon key is a non-empty string or byte array');
  }
  if (typeof traceId != 'string' || !/^[0-9a-f]{32}$/.test(traceId)) {
    throw new TypeError('ttftscope server.js: a trace id is 32 lowercase hex digits');
  }
  return createHmac('sha256', key).update(traceId, 'ascii').digest('hex');
}

/** Adds Server-Timing to `headers`' Access-Control-Expose-Headers (a Headers), once. */
export function exposeServerTiming(headers) {
  const have = (headers.get('access-control-expose-headers') || '').split(',').map(s => s.trim().toLowerCase());
  if (!have.includes('server-timing') && !have.includes('*')) headers.append('access-control-expose-headers', 'Server-Timing');
  return headers;
}

// The metrics of a Server-Timing value (commas inside quoted strings kept), without the
// `trace` and `beacon` ones: the backend's own take their place (the probe reads the first).
export function withoutJoinMetrics(value) {
  const metrics = value.match(/(?:[^,"]|"(?:[^"\\]|\\.)*")+/g) || [];
  return metrics.filter(m => !/^\s*(trace|beacon)\s*(;|$)/i.test(m)).map(m => m.trim()).join(', ');
}
