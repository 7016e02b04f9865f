// server.js signs the beacon token itself (issue 32, item 3): `ttftJoin(req, { beaconKey })`
// answers Server-Timing `trace;desc=<traceparent>, beacon;desc=<hex HMAC-SHA256(key, trace
// id)>` and exposes it to the page; the token is the one tracer/web/probe/token.py computes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { beaconToken, exposeServerTiming, signedServerTiming, ttftJoin } from '../server.js';
import { serverTimingToken, serverTimingTraceId } from '../probe.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736', PARENT = '00f067aa0ba902b7';
const TP = `00-${TRACE}-${PARENT}-01`;
const OWN = `00-${TRACE}-${'a1'.repeat(8)}-01`;

// The Python that signs for the collector: $TTFTSCOPE_PYTHON, else the repository's venv,
// else the main checkout's venv (a worktree shares it), else python3 on PATH.
function python() {
  const candidates = [process.env.TTFTSCOPE_PYTHON, `${REPO}.venv/bin/python`, '/work/main/.venv/bin/python'];
  return candidates.find(p => p && existsSync(p)) || 'python3';
}

test('the token equals BeaconSigner(key).token(trace_id) in Python, for several keys and ids', () => {
  const keys = ['K', 'a shared beacon key', 'ключ-🔑', 'x'.repeat(200), secretHex()];
  const ids = [TRACE, '0'.repeat(31) + '1', 'f'.repeat(32), ...Array.from({ length: 5 }, secretHex)];
  const cases = keys.flatMap(key => ids.map(id => [key, id]));
  const script = 'import json, sys\n'
    + 'from tracer.web.probe.token import BeaconSigner\n'
    + 'print(json.dumps([BeaconSigner.from_setting(k).token(t) for k, t in json.load(sys.stdin)]))\n';
  const out = execFileSync(python(), ['-c', script], {
    input: JSON.stringify(cases), cwd: REPO, env: { ...process.env, PYTHONPATH: REPO } });
  const expected = JSON.parse(out.toString());
  assert.equal(expected.length, cases.length);
  cases.forEach(([key, id], i) => {
    assert.equal(beaconToken(key, id), expected[i], `${key.slice(0, 20)} ${id}`);
    assert.equal(beaconToken(new TextEncoder().encode(key), id), expected[i]);   // bytes alike
  });
});

function secretHex() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), b => b.toString(16).padStart(2, '0')).join('');
}

test('beaconToken refuses an empty key and a trace id that is not 32 lowercase hex digits', () => {
  assert.throws(() => beaconToken('', TRACE), TypeError);
  assert.throws(() => beaconToken(new Uint8Array(0), TRACE), TypeError);
  assert.throws(() => beaconToken(undefined, TRACE), TypeError);
  for (const id of [TRACE.toUpperCase(), TRACE.slice(1), TRACE + '0', 'g'.repeat(32), null]) {
    assert.throws(() => beaconToken('k', id), TypeError, String(id));
  }
});

test('signedServerTiming: what the probe reads back, or null for an invalid traceparent', () => {
  const value = signedServerTiming(TP, 'k');
  assert.equal(value, `trace;desc=${TP}, beacon;desc=${beaconToken('k', TRACE)}`);
  assert.equal(serverTimingToken(value), beaconToken('k', TRACE));
  assert.equal(serverTimingTraceId(value), TRACE);
  assert.equal(signedServerTiming(`ff-${TRACE}-${PARENT}-01`, 'k'), null);
  assert.equal(signedServerTiming(undefined, 'k'), null);
  // a later version is signed as version 00 reads it
  assert.equal(signedServerTiming(`cc-${TRACE}-${PARENT}-01-x`, 'k'), value);
});

async function answered(browserHeaders, options, engineHeaders = {}, own = {}) {
  const join = ttftJoin(browserHeaders, { ...options,
    fetch: async () => new Response('data: [DONE]\n\n', { headers: engineHeaders }) });
  await join.fetch('http://engine.test/v1/chat/completions', { method: 'POST' });
  return { join, res: await join.respond(new Response('data: [DONE]\n\n', { headers: own })) };
}

test('with beaconKey, respond() signs the backend\'s own span context and exposes Server-Timing', async () => {
  const { join, res } = await answered({ traceparent: TP }, { beaconKey: 'k', traceparent: OWN });
  const st = res.headers.get('server-timing');
  assert.equal(st, `trace;desc=${OWN}, beacon;desc=${beaconToken('k', TRACE)}`);
  assert.equal(join.signedServerTiming, st);
  assert.equal(res.headers.get('access-control-expose-headers'), 'Server-Timing');
});

test('without an own span context (or an invalid one) the browser\'s traceparent is signed', async () => {
  for (const traceparent of [undefined, 'not-a-traceparent']) {
    const { res } = await answered({ traceparent: TP }, { beaconKey: 'k', traceparent });
    assert.equal(res.headers.get('server-timing'), `trace;desc=${TP}, beacon;desc=${beaconToken('k', TRACE)}`);
  }
  // no valid traceparent anywhere: nothing to sign, the engine's Server-Timing passes as before
  const { join, res } = await answered({}, { beaconKey: 'k' }, { 'server-timing': 'engine;dur=3' });
  assert.equal(join.signedServerTiming, null);
  assert.equal(res.headers.get('server-timing'), 'engine;dur=3');
  assert.equal(res.headers.get('access-control-expose-headers'), null);
});

test('the engine\'s trace and beacon metrics give way to the backend\'s; its others stay', async () => {
  const engine = `trace;desc="00-${TRACE}-${'0e'.repeat(8)}-01", beacon;desc=${'ab'.repeat(32)}, `
    + 'queue;dur=1.5;desc="a, b", prefill;dur=2';
  const { res } = await answered({ traceparent: TP }, { beaconKey: 'k', traceparent: OWN },
    { 'server-timing': engine }, { 'server-timing': 'app;dur=7', 'access-control-expose-headers': 'X-Request-Id' });
  const st = res.headers.get('server-timing');
  assert.equal(st, `trace;desc=${OWN}, beacon;desc=${beaconToken('k', TRACE)}, app;dur=7, `
    + 'queue;dur=1.5;desc="a, b", prefill;dur=2');
  assert.equal(serverTimingToken(st), beaconToken('k', TRACE));
  assert.equal(res.headers.get('access-control-expose-headers'), 'X-Request-Id, Server-Timing');
});

test('without beaconKey nothing changes: the engine\'s Server-Timing is appended as it came', async () => {
  const { join, res } = await answered({ traceparent: TP }, {}, { 'server-timing': `trace;desc=${TP}` });
  assert.equal(join.signedServerTiming, null);
  assert.equal(res.headers.get('server-timing'), `trace;desc=${TP}`);
  assert.equal(res.headers.get('access-control-expose-headers'), null);
});

test('exposeServerTiming adds the header once, and leaves a wildcard alone', () => {
  const h = exposeServerTiming(exposeServerTiming(new Headers()));
  assert.equal(h.get('access-control-expose-headers'), 'Server-Timing');
  assert.equal(exposeServerTiming(new Headers({ 'access-control-expose-headers': 'server-timing, a' }))
    .get('access-control-expose-headers'), 'server-timing, a');
  assert.equal(exposeServerTiming(new Headers({ 'access-control-expose-headers': '*' }))
    .get('access-control-expose-headers'), '*');
});
