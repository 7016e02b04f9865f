// The probe over Node's real fetch (undici) and a loopback HTTP server: real Response
// objects, real AbortError and "terminated" errors, real chunking.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createProbe } from '../probe.js';
import { delta, readAll } from '../testing/fake_browser.mjs';

const enc = new TextEncoder();
const handlers = {
  // the first content event is cut inside a UTF-8 character and split over two writes
  '/v1/chat/completions': (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'server-timing': `trace;desc=${req.headers.traceparent}` });
    const ev = enc.encode(delta('日本') + delta('!') + 'data: [DONE]\n\n');
    res.write(ev.subarray(0, 40));
    setImmediate(() => res.end(ev.subarray(40)));
  },
  '/hang/completions': (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(delta('a'));
    handlers.hung = res; // never ends until the test says so
  },
  '/cut/completions': (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(delta('a'), () => res.socket.destroy());
  },
};
const server = http.createServer((req, res) => handlers[req.url](req, res));
await new Promise(r => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;
after(() => server.close());

function realProbe() {
  let got;
  const next = new Promise(r => (got = r));
  const global = {
    fetch: globalThis.fetch, performance, crypto: globalThis.crypto, location: { href: `${base}/` },
    setTimeout: (f, ms) => setTimeout(f, ms),
    navigator: { sendBeacon: (url, blob) => (blob.text().then(t => got(JSON.parse(t))), true) },
  };
  return { probe: createProbe({ global }), next };
}

test('real fetch: identical bytes and headers, trace id echoed back by Server-Timing', async () => {
  const plain = await fetch(`${base}/v1/chat/completions`);
  const plainBytes = await readAll(plain);
  const { probe, next } = realProbe();
  const res = await probe.fetch(`${base}/v1/chat/completions`);
  assert.equal(res.status, 200);
  assert.equal(res.url, `${base}/v1/chat/completions`);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  assert.deepEqual(await readAll(res), plainBytes);
  const beacon = await next;
  assert.equal(beacon.outcome, 'ok');
  assert.equal(beacon.chunks, 2);
  assert.equal(beacon.probe_errors, 0);
  assert.equal(beacon.trace_id, beacon.traceparent.split('-')[1]);
  assert.ok(beacon.t.first_token >= beacon.t.first_byte && beacon.t.first_byte >= beacon.t.headers);
  assert.ok(beacon.t.end >= beacon.t.first_token);
});

test('real fetch: aborting mid-stream gives the app the AbortError and the beacon aborted', async () => {
  const { probe, next } = realProbe();
  const ac = new AbortController();
  const res = await probe.fetch(`${base}/hang/completions`, { signal: ac.signal });
  const reader = res.body.getReader();
  assert.match(new TextDecoder().decode((await reader.read()).value), /"a"/);
  ac.abort();
  await assert.rejects(reader.read(), e => e.name === 'AbortError');
  const beacon = await next;
  assert.equal(beacon.outcome, 'aborted');
  assert.equal(beacon.chunks, 1);
  handlers.hung.end();
});

test('real fetch: a connection cut mid-stream errors the app body, outcome network_error', async () => {
  const { probe, next } = realProbe();
  const res = await probe.fetch(`${base}/cut/completions`);
  await assert.rejects(readAll(res), e => e instanceof TypeError);
  assert.equal((await next).outcome, 'network_error');
});

test('real fetch: a refused connection rejects exactly like the native fetch', async () => {
  const dead = http.createServer();
  await new Promise(r => dead.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${dead.address().port}/v1/chat/completions`;
  await new Promise(r => dead.close(r));
  const native = await fetch(url).catch(e => e);
  const { probe, next } = realProbe();
  const probed = await probe.fetch(url).catch(e => e);
  assert.equal(probed.constructor, native.constructor);
  assert.equal(probed.message, native.message);
  assert.equal((await next).outcome, 'network_error');
});
