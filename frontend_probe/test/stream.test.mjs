// End-to-end over a fake browser: scripted bodies, a settable clock, recorded beacons.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createProbe } from '../probe.js';
import { fakeBrowser, delta, roleOnly, sseEvent, readAll, T0 } from '../testing/fake_browser.mjs';

const URL_PATH = '/v1/chat/completions';

// One probed request over `steps`; returns the app's bytes, the beacon and the browser.
async function probed(steps, { respondOpts, browserOpts, probeOpts } = {}) {
  const b = fakeBrowser({ respond: (_, init) => b.sse(steps, { signal: init.signal, ...respondOpts }), ...browserOpts });
  const probe = createProbe({ global: b.global, random: () => 0 }).install(probeOpts);
  const res = await b.global.fetch(URL_PATH, { method: 'POST', body: '{}' });
  const bytes = await readAll(res);
  const sent = await b.nextBeacon();
  return { res, bytes, beacon: sent.json, via: sent.via, collector: sent.url, b, probe };
}

test('TTFT starts at the first non-empty content, not at an earlier role-only chunk', async () => {
  const { beacon } = await probed([
    { at: 10, data: roleOnly() },
    { at: 15, frame: true },
    { at: 40, data: delta('Hel') },
    { at: 45, frame: true },
    { at: 50, data: delta('lo') },
    { at: 60, data: sseEvent({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2 } }) },
    { at: 61, data: 'data: [DONE]\n\n' },
  ]);
  assert.equal(beacon.t.first_byte, 10);
  assert.equal(beacon.t.first_token, 40);
  assert.equal(beacon.t.first_paint, 45);
  assert.equal(beacon.t.end, 61);
  assert.equal(beacon.t.headers, 2);
  assert.equal(beacon.t.start, 0);
  assert.equal(beacon.chunks, 2);
  assert.equal(beacon.outcome, 'ok');
  assert.equal(beacon.probe_errors, 0);
});

test('an event split over three chunks counts when its last piece arrives', async () => {
  const ev = delta('abc');
  const { beacon, bytes } = await probed([
    { at: 5, data: ev.slice(0, 7) },
    { at: 9, data: ev.slice(7, 20) },
    { at: 30, data: ev.slice(20) },
  ]);
  assert.equal(beacon.t.first_byte, 5);
  assert.equal(beacon.t.first_token, 30);
  assert.equal(beacon.chunks, 1);
  assert.equal(new TextDecoder().decode(bytes), ev);
});

test('a UTF-8 character split across chunks: content counted once, no probe error', async () => {
  const ev = new TextEncoder().encode(delta('é') + delta('ü'));
  const cut = ev.indexOf(0xc3) + 1;
  const { beacon, bytes } = await probed([{ at: 7, data: ev.subarray(0, cut) }, { at: 11, data: ev.subarray(cut) }]);
  assert.equal(beacon.t.first_token, 11);
  assert.equal(beacon.chunks, 2);
  assert.equal(beacon.probe_errors, 0);
  assert.deepEqual(bytes, ev);
});

test('keep-alive comments and [DONE] are not content; \\r\\n endings work', async () => {
  const crlf = s => s.replaceAll('\n', '\r\n');
  const { beacon } = await probed([
    { at: 3, data: ': ping\r\n\r\n' },
    { at: 20, data: crlf(delta('a')) },
    { at: 22, data: ': ping\r\n\r\n' },
    { at: 25, data: crlf(delta('b')) + 'data: [DONE]\r\n\r\n' },
  ]);
  assert.equal(beacon.t.first_byte, 3);
  assert.equal(beacon.t.first_token, 20);
  assert.equal(beacon.chunks, 2);
  assert.equal(beacon.probe_errors, 0);
});

test('ITL statistics in the beacon are exact for content arrivals at 10, 15, 17, 27, 28 ms', async () => {
  const { beacon } = await probed([10, 15, 17, 27, 28].map(at => ({ at, data: delta('x') })));
  const { count, mean, p50, p95, max } = beacon.itl_ms;
  assert.deepEqual([count, mean, p50, max], [4, 4.5, 3.5, 10]);
  assert.ok(Math.abs(p95 - 9.25) < 1e-9);
});

test('completions: choices[0].text is content; an empty text is not', async () => {
  const text = t => sseEvent({ choices: [{ index: 0, text: t }] });
  const { beacon } = await probed([{ at: 4, data: text('') }, { at: 9, data: text(' Paris') }], {
    probeOpts: { match: /completions$/ },
  });
  assert.equal(beacon.t.first_token, 9);
  assert.equal(beacon.chunks, 1);
});

test('a non-streamed JSON answer: first token is when the whole body is parsed', async () => {
  const body = JSON.stringify({ choices: [{ message: { role: 'assistant', content: 'Paris.' } }] });
  const { beacon, bytes } = await probed([{ at: 8, data: body.slice(0, 10) }, { at: 12, data: body.slice(10) }, { at: 13 }], {
    respondOpts: { headers: { 'content-type': 'application/json' } },
  });
  assert.equal(beacon.t.first_byte, 8);
  assert.equal(beacon.t.first_token, 13);
  assert.equal(beacon.t.end, 13);
  assert.equal(beacon.chunks, 1);
  assert.equal(new TextDecoder().decode(bytes), body);
});

test('HTTP 500: outcome http_error, status kept, body passed through untouched', async () => {
  const err = JSON.stringify({ error: { message: 'boom', type: 'server_error', param: null, code: null } });
  const { beacon, res, bytes } = await probed([{ at: 6, data: err }], {
    respondOpts: { status: 500, headers: { 'content-type': 'application/json' } },
  });
  assert.equal(res.status, 500);
  assert.equal(res.ok, false);
  assert.equal(new TextDecoder().decode(bytes), err);
  assert.equal(beacon.outcome, 'http_error');
  assert.equal(beacon.status, 500);
  assert.equal(beacon.t.first_token, null);
});

test('a malformed event counts as a probe error and changes nothing for the app', async () => {
  const raw = 'data: {not json\n\n' + delta('ok');
  const { beacon, bytes } = await probed([{ at: 5, data: raw }]);
  assert.equal(beacon.probe_errors, 1);
  assert.equal(beacon.chunks, 1);
  assert.equal(beacon.outcome, 'ok');
  assert.equal(new TextDecoder().decode(bytes), raw);
});

test('first paint is the animation frame after the first content; a hidden tab sends null', async () => {
  const b = fakeBrowser({ hidden: true, respond: () => b.sse([{ at: 5, data: delta('a') }, { at: 9, data: delta('b') }]) });
  createProbe({ global: b.global, random: () => 0 }).install();
  await readAll(await b.global.fetch(URL_PATH, {}));
  assert.equal(b.frames.length, 1); // requested once, never run: the tab is hidden
  await new Promise(r => setImmediate(r)); // let the zero-delay timer queue drain first
  assert.deepEqual(b.beaconsSoFar(), []);
  b.runDelayed(); // the paint wait expires
  const { json } = await b.nextBeacon();
  assert.equal(json.t.first_token, 5);
  assert.equal(json.t.first_paint, null);
});

test('without requestAnimationFrame the paint falls back to setTimeout(0)', async () => {
  const { beacon, b } = await probed([{ at: 5, data: delta('a') }, { at: 9, data: delta('b') }], {
    browserOpts: { raf: false },
  });
  assert.equal(b.timerDelays[0], 0);
  assert.ok(beacon.t.first_paint >= beacon.t.first_token);
});

test('sendBeacon missing: the beacon goes by fetch keepalive to the collector', async () => {
  const { b, beacon, via } = await probed([{ at: 5, data: delta('a') }], {
    browserOpts: { sendBeacon: false },
    probeOpts: { collector: 'https://collector.example/v1/probe', model: 'smollm2' },
  });
  const post = b.fetches.find(f => f.init && f.init.keepalive);
  assert.equal(post.input, 'https://collector.example/v1/probe');
  assert.equal(post.init.method, 'POST');
  assert.equal(post.init.headers['content-type'], 'text/plain;charset=UTF-8');
  assert.equal(via, 'fetch');
  assert.equal(beacon.model, 'smollm2');
  assert.equal(beacon.t.first_token, 5);
});

test('sendBeacon refusing (queue full) also falls back to fetch keepalive', async () => {
  const refused = [];
  const { b, beacon } = await probed([{ at: 5, data: delta('a') }], {
    browserOpts: { sendBeacon: (url, blob) => (refused.push(url), false) },
  });
  assert.deepEqual(refused, ['/v1/probe']);
  assert.ok(b.fetches.some(f => f.input === '/v1/probe' && f.init.keepalive));
  assert.equal(beacon.outcome, 'ok');
});

test('the beacon has exactly the documented fields and is sent once, via sendBeacon', async () => {
  const tp = `00-${'9a'.repeat(16)}-${'bc'.repeat(8)}-01`;
  const { b, beacon, via, collector } = await probed([{ at: 5, data: delta('a') }], {
    respondOpts: { headers: { 'content-type': 'text/event-stream', 'server-timing': `app;dur=3, trace;desc="${tp}"` } },
  });
  assert.deepEqual(Object.keys(beacon).sort(), [
    'chunk_ms', 'chunks', 'format', 'input_ms', 'itl_ms', 'outcome', 'probe_errors', 'resource', 'sdk',
    'status', 't', 'trace_id', 'traceparent', 'url_path', 'v',
  ]);
  assert.equal(beacon.format, 'openai');
  assert.deepEqual(Object.keys(beacon.t), ['start', 'headers', 'first_byte', 'first_token', 'first_paint', 'end']);
  assert.equal(via, 'sendBeacon');
  assert.equal(collector, '/v1/probe');
  assert.equal(beacon.v, 1);
  assert.equal(beacon.sdk, 'ttftscope-probe/0.1.0');
  assert.equal(beacon.url_path, URL_PATH);
  assert.equal(beacon.status, 200);
  assert.equal(beacon.resource, null);
  // the server's trace wins; the traceparent is the one the probe sent
  assert.equal(beacon.trace_id, '9a'.repeat(16));
  assert.equal(beacon.traceparent, b.fetches[0].init.headers.get('traceparent'));
  await new Promise(r => setImmediate(r));
  assert.deepEqual(b.beaconsSoFar(), []);
});

test('Resource Timing: the entry closest to this request gives the breakdown', async () => {
  const name = `http://localhost${URL_PATH}`;
  const entry = (startTime, extra) => ({
    name, startTime, domainLookupStart: startTime + 1, domainLookupEnd: startTime + 4, connectStart: startTime + 4,
    secureConnectionStart: startTime + 6, connectEnd: startTime + 12, requestStart: startTime + 12,
    responseStart: startTime + 40, responseEnd: startTime + 90, ...extra,
  });
  const entries = [entry(T0 - 500), entry(T0 + 0.5), entry(T0 + 900)];
  const { beacon } = await probed([{ at: 5, data: delta('a') }], { browserOpts: { entries } });
  assert.deepEqual(beacon.resource, { dns_ms: 3, connect_ms: 8, tls_ms: 6, request_ms: 28, response_ms: 50 });
  const opaque = [entry(T0, { requestStart: 0, responseStart: 0, domainLookupStart: 0, domainLookupEnd: 0 })];
  const { beacon: hidden } = await probed([{ at: 5, data: delta('a') }], { browserOpts: { entries: opaque } });
  assert.equal(hidden.resource, null); // cross-origin without Timing-Allow-Origin
});

test('a probe-internal failure is counted and never reaches the page', async () => {
  const steps = [{ at: 5, data: delta('a') }];
  const { beacon, bytes } = await probed(steps);
  assert.equal(beacon.probe_errors, 0);
  const b = fakeBrowser({ respond: () => b.sse(steps) });
  b.global.performance.getEntriesByName = () => {
    throw new Error('broken performance');
  };
  createProbe({ global: b.global, random: () => 0 }).install();
  const appBytes = await readAll(await b.global.fetch(URL_PATH, {}));
  const broken = (await b.nextBeacon()).json;
  assert.equal(broken.probe_errors, 1);
  assert.equal(broken.resource, null);
  assert.equal(broken.t.first_token, 5);
  assert.deepEqual(appBytes, bytes);
});
