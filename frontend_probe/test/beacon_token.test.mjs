// The beacon token (tracer/web/probe/token.py): read from Server-Timing, returned in the
// beacon, absent when the server sent none.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createProbe, serverTimingToken } from '../probe.js';
import { fakeBrowser, delta } from '../testing/fake_browser.mjs';

const TOKEN = 'ab'.repeat(32);
const TP = '00-' + '12'.repeat(16) + '-' + '34'.repeat(8) + '-01';

test('Server-Timing: the beacon metric is found among others, quoted or not', () => {
  assert.equal(serverTimingToken(`trace;desc=${TP}, beacon;desc=${TOKEN}`), TOKEN);
  assert.equal(serverTimingToken(`beacon;desc="${TOKEN.toUpperCase()}", trace;desc=${TP}`), TOKEN);
  assert.equal(serverTimingToken(`mybeacon;desc=${TOKEN}`), null);
  assert.equal(serverTimingToken(`beacon;desc=${TOKEN}ab`), null);   // not 64 hex digits
  assert.equal(serverTimingToken(`beacon;desc=${TOKEN.slice(2)}`), null);
  assert.equal(serverTimingToken(`trace;desc=${TP}`), null);
  assert.equal(serverTimingToken(null), null);
});

function probeWith(serverTiming) {
  const headers = { 'content-type': 'text/event-stream', ...(serverTiming ? { 'server-timing': serverTiming } : {}) };
  const b = fakeBrowser({ respond: (_, init) => b.sse([
    { at: 3, data: delta('hi') }, { at: 5, data: 'data: [DONE]\n\n' }],
  { signal: init && init.signal, headers }) });
  const probe = createProbe({ global: b.global, random: () => 0 });
  probe.install();
  return b;
}

async function drain(res) {
  const reader = res.body.getReader();
  while (!(await reader.read()).done);
}

test('the beacon carries the token the response sent, and none when it sent none', async () => {
  const signed = probeWith(`trace;desc=${TP}, beacon;desc=${TOKEN}`);
  await drain(await signed.global.fetch('/v1/chat/completions', {}));
  const beacon = (await signed.nextBeacon()).json;
  assert.equal(beacon.token, TOKEN);
  assert.equal(beacon.trace_id, '12'.repeat(16));

  const unsigned = probeWith(null);
  await drain(await unsigned.global.fetch('/v1/chat/completions', {}));
  assert.equal('token' in (await unsigned.nextBeacon()).json, false);
});
