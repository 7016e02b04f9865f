// The probe's contract with the page: same promise outcome, same bytes, no header when
// unsampled, abort and network errors passed through unchanged, one beacon each time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createProbe } from '../probe.js';
import { fakeBrowser, delta, readAll, roleOnly } from '../testing/fake_browser.mjs';

const URL_PATH = '/v1/chat/completions';
const TP = /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/;
const steps = () => [
  { at: 3, data: roleOnly() },
  { at: 9, data: delta('你好').slice(0, 30) },
  { at: 10, data: delta('你好').slice(30) + delta('!') },
  { at: 12, data: 'data: [DONE]\n\n' },
];

function setup(respondSteps = steps, browserOpts = {}) {
  const b = fakeBrowser({ respond: (_, init) => b.sse(respondSteps(), { signal: init && init.signal }), ...browserOpts });
  return { b, probe: createProbe({ global: b.global, random: () => 0 }) };
}

test("the app's bytes, status and headers are identical with and without the probe", async () => {
  const plain = setup();
  const without = await plain.b.global.fetch(URL_PATH, {});
  const traced = setup();
  traced.probe.install();
  const withProbe = await traced.b.global.fetch(URL_PATH, {});
  assert.notEqual(withProbe, without);
  assert.equal(withProbe.status, without.status);
  assert.equal(withProbe.statusText, without.statusText);
  assert.equal(withProbe.url, without.url);
  assert.equal(withProbe.type, without.type);
  assert.deepEqual([...withProbe.headers], [...without.headers]);
  assert.deepEqual(await readAll(withProbe), await readAll(without));
  assert.equal((await traced.b.nextBeacon()).json.chunks, 2);
});

test('the app gets each chunk as it arrives, before the stream ends', async () => {
  let release;
  const gate = new Promise(r => (release = r));
  const b = fakeBrowser({
    respond: () => new Response(new ReadableStream({
      async start(c) {
        c.enqueue(new TextEncoder().encode(delta('first')));
        await gate; // the server has not sent the rest yet
        c.close();
      },
    }), { headers: { 'content-type': 'text/event-stream' } }),
  });
  createProbe({ global: b.global }).install();
  const reader = (await b.global.fetch(URL_PATH, {})).body.getReader();
  const first = await reader.read();
  assert.equal(new TextDecoder().decode(first.value), delta('first'));
  release();
  assert.equal((await reader.read()).done, true);
  assert.equal((await b.nextBeacon()).json.outcome, 'ok');
});

test('a fresh traceparent is added; a caller-provided one is reused, from init or a Request', async () => {
  const { b, probe } = setup();
  probe.install();
  await readAll(await b.global.fetch(URL_PATH, { headers: { 'x-app': '1' } }));
  const sent = b.fetches[0].init.headers;
  assert.match(sent.get('traceparent'), TP);
  assert.equal(sent.get('x-app'), '1');
  assert.equal((await b.nextBeacon()).json.traceparent, sent.get('traceparent'));

  const mine = `00-${'ab'.repeat(16)}-${'cd'.repeat(8)}-01`;
  await readAll(await b.global.fetch(URL_PATH, { headers: { TraceParent: mine } }));
  assert.equal(b.fetches.at(-1).init.headers.get('traceparent'), mine);
  const beacon = (await b.nextBeacon()).json;
  assert.equal(beacon.traceparent, mine);
  assert.equal(beacon.trace_id, 'ab'.repeat(16));

  const req = new Request('http://localhost/v1/chat/completions', { method: 'POST', body: '{}', headers: { traceparent: mine, 'x-r': 'y' } });
  await readAll(await b.global.fetch(req));
  assert.equal(b.fetches.at(-1).init.headers.get('traceparent'), mine);
  assert.equal(b.fetches.at(-1).init.headers.get('x-r'), 'y');
  assert.equal((await b.nextBeacon()).json.traceparent, mine);
});

test('sampleRate 0: the native promise itself, no header, no body wrapper, no beacon', async () => {
  const { b, probe } = setup();
  const native = b.global.fetch;
  let nativePromise;
  b.global.fetch = (input, init) => (nativePromise = native(input, init));
  probe.install({ sampleRate: 0 });
  const init = { headers: { 'x-app': '1' } };
  const returned = b.global.fetch(URL_PATH, init);
  assert.equal(returned, nativePromise);
  assert.equal(b.fetches[0].init, init);
  const res = await returned;
  await readAll(res);
  probe.install({ sampleRate: 1 }); // a later request that is sampled does send a beacon
  await readAll(await b.global.fetch(URL_PATH, {}));
  const beacon = await b.nextBeacon();
  assert.equal(beacon.json.traceparent, b.fetches.at(-1).init.headers.get('traceparent'));
  assert.deepEqual(b.beaconsSoFar(), []);
});

test('sampling is decided per request against random()', async () => {
  const draws = [0.2, 0.7, 0.49];
  const b = fakeBrowser({ respond: () => b.sse(steps()) });
  createProbe({ global: b.global, random: () => draws.shift() }).install({ sampleRate: 0.5 });
  for (let i = 0; i < 3; i++) await readAll(await b.global.fetch(URL_PATH, {}));
  const headers = b.fetches.filter(f => !f.init.keepalive).map(f => new Headers(f.init.headers).has('traceparent'));
  assert.deepEqual(headers, [true, false, true]);
});

test('a network error rejects the app with the very same error, and is reported', async () => {
  const boom = new TypeError('Failed to fetch');
  const b = fakeBrowser({ respond: () => Promise.reject(boom) });
  createProbe({ global: b.global }).install();
  await assert.rejects(b.global.fetch(URL_PATH, {}), e => e === boom);
  const { json } = await b.nextBeacon();
  assert.equal(json.outcome, 'network_error');
  assert.equal(json.status, null);
  assert.equal(json.t.headers, null);
  assert.equal(json.t.first_byte, null);
  assert.equal(typeof json.t.end, 'number');
});

test('a network error mid-stream errors the app body with the same error', async () => {
  const cut = new TypeError('network error');
  const { b, probe } = setup(() => [{ at: 5, data: delta('a') }, { at: 8, error: cut }]);
  probe.install();
  const res = await b.global.fetch(URL_PATH, {});
  await assert.rejects(readAll(res), e => e === cut);
  const { json } = await b.nextBeacon();
  assert.equal(json.outcome, 'network_error');
  assert.equal(json.t.first_token, 5);
  assert.equal(json.t.end, 8);
});

test('aborting mid-stream: the app sees the AbortError, the beacon still goes, outcome aborted', async () => {
  const ac = new AbortController();
  const { b, probe } = setup(() => [{ at: 5, data: delta('a') }, { at: 7, run: () => ac.abort() }, { at: 9, data: delta('never') }]);
  probe.install();
  const res = await b.global.fetch(URL_PATH, { signal: ac.signal });
  await assert.rejects(readAll(res), e => e.name === 'AbortError');
  const { json } = await b.nextBeacon();
  assert.equal(json.outcome, 'aborted');
  assert.equal(json.chunks, 1);
  assert.equal(json.t.end, 7);
});

test('aborting before the response: same rejection as native, outcome aborted', async () => {
  const ac = new AbortController();
  const b = fakeBrowser({ respond: (_, init) => Promise.reject(init.signal.reason) });
  createProbe({ global: b.global }).install();
  ac.abort();
  const reason = ac.signal.reason;
  await assert.rejects(b.global.fetch(URL_PATH, { signal: ac.signal }), e => e === reason);
  assert.equal((await b.nextBeacon()).json.outcome, 'aborted');
});

test('the app cancelling its reader cancels the network body too (outcome aborted)', async () => {
  let source;
  const b = fakeBrowser({ respond: () => (source = b.sse([{ at: 5, data: delta('a') }, { at: 6, data: delta('b') }, { at: 7, data: delta('c') }])) });
  createProbe({ global: b.global }).install();
  const reader = (await b.global.fetch(URL_PATH, {})).body.getReader();
  await reader.read();
  await reader.cancel('user pressed stop');
  const { json } = await b.nextBeacon();
  assert.equal(json.outcome, 'aborted');
  assert.deepEqual(source.cancels, ['user pressed stop']);
});

test('a body-less response (204) is passed through as is and reported', async () => {
  const b = fakeBrowser({ respond: () => new Response(null, { status: 204 }) });
  createProbe({ global: b.global }).install();
  const native = await b.global.fetch(URL_PATH, {});
  assert.equal(native.status, 204);
  assert.equal(native.body, null);
  const { json } = await b.nextBeacon();
  assert.equal(json.outcome, 'ok');
  assert.equal(json.t.end, json.t.headers);
});
