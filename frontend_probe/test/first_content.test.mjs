// The probe's "first content" rule on the recorded streams the Python tests also read
// (tests/fixtures/sse/, README.md there): same files, same expected first-content index.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createProbe, hasContent, sseParser, utf8Feed } from '../probe.js';
import { fakeBrowser, readAll } from '../testing/fake_browser.mjs';

const FIXTURES = new URL('../../tests/fixtures/sse/', import.meta.url);
const EXPECTED = JSON.parse(readFileSync(new URL('expected.json', FIXTURES), 'utf8'));
const NAMES = Object.keys(EXPECTED).sort();

// The body and its recorded network chunks (one chunk without a NAME.chunks.json).
function recorded(name) {
  const bytes = new Uint8Array(readFileSync(new URL(name, FIXTURES)));
  const cutsFile = new URL(name.replace(/\.sse$/, '.chunks.json'), FIXTURES);
  const cuts = existsSync(cutsFile) ? JSON.parse(readFileSync(cutsFile, 'utf8')) : [];
  const bounds = [0, ...cuts, bytes.length];
  return { bytes, chunks: bounds.slice(1).map((b, i) => bytes.subarray(bounds[i], b)) };
}

// The data of each event, and the chunk that completed it, as the probe decodes them.
function eventsOf(chunks) {
  const events = [];
  let k = 0;
  const feed = utf8Feed(sseParser(data => events.push({ data, chunk: k })));
  for (; k < chunks.length; k++) feed(chunks[k]);
  feed();
  return events;
}

const isContent = e => e.data != '[DONE]' && hasContent(JSON.parse(e.data));
const firstIndex = events => {
  const i = events.findIndex(isContent);
  return i < 0 ? null : i;
};

test('every fixture is listed in expected.json and the other way round', () => {
  const onDisk = readdirSync(FIXTURES).filter(f => f.endsWith('.sse')).sort();
  assert.deepEqual(onDisk, NAMES);
  assert.ok(NAMES.length >= 9);
  assert.ok(Object.values(EXPECTED).includes(null));
});

for (const name of NAMES) {
  test(`${name}: hasContent finds the recorded first content`, () => {
    const { chunks } = recorded(name);
    const events = eventsOf(chunks);
    assert.equal(events.at(-1).data, '[DONE]');
    assert.equal(firstIndex(events), EXPECTED[name]);
  });

  test(`${name}: the probe's first_token is the chunk completing that event`, async () => {
    const { bytes, chunks } = recorded(name);
    const events = eventsOf(chunks);
    const content = events.filter(isContent);
    const b = fakeBrowser({ respond: () => b.sse(chunks.map((data, k) => ({ at: 10 * (k + 1), data }))) });
    createProbe({ global: b.global, random: () => 0 }).install();
    const res = await b.global.fetch('/v1/chat/completions', { method: 'POST', body: '{}' });
    assert.deepEqual(await readAll(res), bytes);
    const { json: beacon } = await b.nextBeacon();
    assert.equal(beacon.t.first_token, content.length ? 10 * (content[0].chunk + 1) : null);
    assert.equal(beacon.chunks, content.length);
    assert.equal(beacon.probe_errors, 0);
    assert.equal(beacon.outcome, 'ok');
  });
}

test('the rule: any choice; delta.content, text or message.content; a non-empty string', () => {
  const yes = [
    { choices: [{ delta: {} }, { index: 1, delta: { content: 'x' } }] },
    { choices: [null, { text: ' ' }] },
    { choices: [{ message: { content: 'x' } }] },
  ];
  const no = [
    { choices: [{ delta: { reasoning_content: 'thinking' } }] },
    { choices: [{ delta: { content: [{ type: 'text', text: 'x' }] } }] },
    { choices: [{ delta: 'x', message: ['x'], text: 5 }] },
    { choices: { 0: { text: 'x' } } },
    { error: { message: 'boom', content: 'partial' } },
    { content: 'x', text: 'x' },
    [{ choices: [{ text: 'x' }] }], 'x', null, 7,
  ];
  for (const j of yes) assert.equal(hasContent(j), true, JSON.stringify(j));
  for (const j of no) assert.equal(hasContent(j), false, JSON.stringify(j));
});

test('the core probe alone: an OpenAI tool call is t.first_tool_call; its tool_calls list needs formats.js', async () => {
  const named = { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { name: 'f', arguments: '' } }] } }] };
  assert.equal(hasContent(named), false);
  const b = fakeBrowser({ respond: () => b.sse([{ at: 6, data: `data: ${JSON.stringify(named)}\n\n` },
    { at: 9, data: 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n' }]) });
  createProbe({ global: b.global }).install();
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.t.first_tool_call, 6);
  assert.equal(json.t.first_token, null);
  assert.equal(json.tool_calls, undefined);
});
