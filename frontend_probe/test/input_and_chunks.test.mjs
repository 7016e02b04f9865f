// markInput() → input_ms, and chunk_ms: the arrival of the first content chunks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createProbe } from '../probe.js';
import { fakeBrowser, delta, readAll, roleOnly, T0 } from '../testing/fake_browser.mjs';

const URL_PATH = '/v1/chat/completions';

function setup({ draws, steps } = {}) {
  const b = fakeBrowser({ respond: () => b.sse(steps ? steps() : [{ at: 5, data: delta('a') }]) });
  const random = draws ? () => draws.shift() : () => 0;
  const probe = createProbe({ global: b.global, random });
  return { b, probe };
}

test('markInput(): the next probed fetch reports input_ms; the one after does not', async () => {
  const { b, probe } = setup();
  probe.install();
  b.clock.t = T0 - 250;      // the user pressed Enter 250 ms before the page called fetch
  probe.markInput();
  b.clock.t = T0;
  await readAll(await b.global.fetch(URL_PATH, {}));
  assert.equal((await b.nextBeacon()).json.input_ms, 250);
  b.clock.t = T0;
  await readAll(await b.global.fetch(URL_PATH, {}));
  assert.equal((await b.nextBeacon()).json.input_ms, null);
});

test('without markInput(), input_ms is null', async () => {
  const { b, probe } = setup();
  probe.install();
  await readAll(await b.global.fetch(URL_PATH, {}));
  assert.equal((await b.nextBeacon()).json.input_ms, null);
});

test('an unsampled request takes the mark too, so a later request never reuses it', async () => {
  const { b, probe } = setup({ draws: [0.9, 0.1] });
  probe.install({ sampleRate: 0.5 });
  b.clock.t = T0 - 100;
  probe.markInput();
  b.clock.t = T0;
  await readAll(await b.global.fetch(URL_PATH, {}));   // unsampled: no beacon
  b.clock.t = T0;
  await readAll(await b.global.fetch(URL_PATH, {}));   // sampled
  const { json } = await b.nextBeacon();
  assert.equal(json.input_ms, null);
  assert.deepEqual(b.beaconsSoFar(), []);
});

test('a request the probe does not match leaves the mark for the chat request', async () => {
  const { b, probe } = setup();
  probe.install();
  b.clock.t = T0 - 40;
  probe.markInput();
  b.clock.t = T0 - 20;
  await b.global.fetch('/v1/models', {});               // not a completion: not probed
  b.clock.t = T0;
  await readAll(await b.global.fetch(URL_PATH, {}));
  assert.equal((await b.nextBeacon()).json.input_ms, 40);
});

test('a mark older than a minute is dropped: that Enter did not start this request', async () => {
  const { b, probe } = setup();
  probe.install();
  b.clock.t = T0 - 60001;
  probe.markInput();
  b.clock.t = T0;
  await readAll(await b.global.fetch(URL_PATH, {}));
  assert.equal((await b.nextBeacon()).json.input_ms, null);
});

test('chunk_ms holds the arrival of each content chunk (role-only chunks are not content)', async () => {
  const steps = () => [
    { at: 3, data: roleOnly() },
    { at: 9, data: delta('a') },
    { at: 15, data: delta('b') + delta('c') },   // two events in one read: same arrival
    { at: 40, data: delta('d') },
    { at: 41, data: 'data: [DONE]\n\n' },
  ];
  const { b, probe } = setup({ steps });
  probe.install();
  await readAll(await b.global.fetch(URL_PATH, {}));
  const { json } = await b.nextBeacon();
  assert.deepEqual(json.chunk_ms, [9, 15, 15, 40]);
  assert.equal(json.chunk_ms[0], json.t.first_token);
  assert.equal(json.chunks, 4);
});

test('chunk_ms stops at 32 entries while chunks keeps counting', async () => {
  const steps = () => Array.from({ length: 40 }, (_, i) => ({ at: 10 + i, data: delta('x') }));
  const { b, probe } = setup({ steps });
  probe.install();
  await readAll(await b.global.fetch(URL_PATH, {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.chunks, 40);
  assert.equal(json.chunk_ms.length, 32);
  assert.deepEqual(json.chunk_ms, Array.from({ length: 32 }, (_, i) => 10 + i));
});
