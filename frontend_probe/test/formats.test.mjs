// The stream-format rules (formats.js, probe.js RULES) on the recorded streams of every format
// that the Python rule (tracer/record/first_content.py) also reads: tests/fixtures/sse/formats/
// (README.md there). Same files, same expected first content, first reasoning and format.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createProbe, RULES, sseParser, utf8Feed } from '../probe.js';
import { FORMAT_RULES } from '../formats.js';
import { fakeBrowser, readAll, sseEvent } from '../testing/fake_browser.mjs';

const FIXTURES = new URL('../../tests/fixtures/sse/formats/', import.meta.url);
const EXPECTED = JSON.parse(readFileSync(new URL('expected.json', FIXTURES), 'utf8'));
const NAMES = Object.keys(EXPECTED).sort();
// The closed set of the beacon's `format` (tracer/web/probe/schema.py FORMATS).
const SCHEMA_FORMATS = ['openai', 'gemini', 'ollama', 'openai-responses', 'anthropic', 'ai-sdk-ui', 'text', 'custom'];

function recorded(name) {
  const bytes = new Uint8Array(readFileSync(new URL(name, FIXTURES)));
  const cutsFile = new URL(name.replace(/\.\w+$/, '.chunks.json'), FIXTURES);
  const cuts = existsSync(cutsFile) ? JSON.parse(readFileSync(cutsFile, 'utf8')) : [];
  const bounds = [0, ...cuts, bytes.length];
  return { bytes, chunks: bounds.slice(1).map((b, i) => bytes.subarray(bounds[i], b)) };
}

// Each event's data (SSE data, an NDJSON line, a plain-text read's decoded text) and the chunk
// that completed it, decoded the way the probe decodes them.
function eventsOf(name, chunks) {
  const events = [];
  let k = 0;
  const push = data => events.push({ data, chunk: k });
  const parse = name.endsWith('.txt') ? (text, end) => (text || !end) && push(text)
    : sseParser(push, null, name.endsWith('.ndjson'));
  const feed = utf8Feed(parse);
  for (; k < chunks.length; k++) feed(chunks[k]);
  k--;
  feed();
  return events.filter((e, i) => !name.endsWith('.txt') || i < chunks.length);
}

// [format, kinds] by the probe's rules: the first recognised shape decides the format.
function judge(name, events) {
  const kinds = [];
  let format = EXPECTED[name].headers ? 'ai-sdk-ui' : null;
  for (const { data } of events) {
    if (name.endsWith('.txt')) {
      format = 'text';
      kinds.push(data ? 1 : 0);
      continue;
    }
    if (data == '[DONE]') {
      kinds.push(0);
      continue;
    }
    const j = JSON.parse(data);
    let k, f = format;
    if (f) k = RULES[f](j);
    else for (f in RULES) if ((k = RULES[f](j)) != null) break;
    if (k != null) format = f;
    kinds.push(typeof k == 'number' || typeof k == 'boolean' ? Number(k) : 0);
  }
  return [format, kinds];
}
const index = (kinds, k) => (kinds.indexOf(k) < 0 ? null : kinds.indexOf(k));

test('every fixture is listed in expected.json, with a known format', () => {
  const onDisk = readdirSync(FIXTURES).filter(f => /\.(sse|ndjson|txt)$/.test(f)).sort();
  assert.deepEqual(onDisk, NAMES);
  assert.deepEqual(new Set(Object.values(EXPECTED).map(e => e.format)),
    new Set(SCHEMA_FORMATS.filter(f => f != 'custom')));
});

test('the closed set: the rules of probe.js and formats.js, a plain-text stream, a hook', () => {
  assert.deepEqual([...Object.keys(RULES), 'text', 'custom'], SCHEMA_FORMATS);
  assert.deepEqual(Object.keys(FORMAT_RULES), SCHEMA_FORMATS.slice(1, -2));
});

for (const name of NAMES) {
  const want = EXPECTED[name];
  test(`${name}: the rules find the format, the first content and the first reasoning`, () => {
    const { chunks } = recorded(name);
    const [format, kinds] = judge(name, eventsOf(name, chunks));
    assert.equal(format, want.format);
    assert.equal(index(kinds, 1), want.first_content);
    assert.equal(index(kinds, 2), want.first_reasoning);
    assert.equal(kinds.filter(k => k == 1).length, want.content_events);
  });

  test(`${name}: the probe's beacon: format, first_token, first_reasoning, chunks`, async () => {
    const { bytes, chunks } = recorded(name);
    const events = eventsOf(name, chunks);
    const [, kinds] = judge(name, events);
    const at = k => (k == null ? undefined : 10 * (events[k].chunk + 1));
    const headers = { 'content-type': want.content_type, ...want.headers };
    const b = fakeBrowser({ respond: () => b.sse(chunks.map((data, k) => ({ at: 10 * (k + 1), data })), { headers }) });
    createProbe({ global: b.global, random: () => 0 }).install();
    const res = await b.global.fetch('/v1/chat/completions', { method: 'POST', body: '{}' });
    assert.deepEqual(await readAll(res), bytes);
    const { json: beacon } = await b.nextBeacon();
    assert.equal(beacon.format, want.format);
    assert.equal(beacon.t.first_token, at(want.first_content) ?? null);
    assert.equal(beacon.t.first_reasoning, at(want.first_reasoning));
    assert.equal(beacon.chunks, want.content_events);
    assert.equal(beacon.chunks, kinds.filter(k => k == 1).length);
    assert.equal(beacon.probe_errors, 0);
    assert.equal(beacon.server, want.server);
  });
}

test('install({format}) forces a rule: an Anthropic-shaped event in a forced OpenAI stream is not content', async () => {
  const anthropic = sseEvent({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } });
  for (const [format, first] of [['openai', null], ['anthropic', 4], [undefined, 4]]) {
    const b = fakeBrowser({ respond: () => b.sse([{ at: 4, data: anthropic }]) });
    createProbe({ global: b.global }).install({ format });
    await readAll(await b.global.fetch('/v1/chat/completions', {}));
    const { json } = await b.nextBeacon();
    assert.equal(json.t.first_token, first, String(format));
    assert.equal(json.format, format ?? 'anthropic');
  }
});

test('install({format: "text"}) reads any body as text; isContent decides for a house format', async () => {
  let b = fakeBrowser({ respond: () => b.sse([{ at: 3, data: '' }, { at: 5, data: 'data: x\n\n' }]) });
  createProbe({ global: b.global }).install({ format: 'text' });
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  let { json } = await b.nextBeacon();
  assert.equal(json.format, 'text');
  assert.equal(json.t.first_token, 5);

  const seen = [];
  const isContent = e => (seen.push(e), e.kind == 'token');
  b = fakeBrowser({ respond: () => b.sse([{ at: 3, data: sseEvent({ choices: [{ delta: { content: 'no' } }] }) },
    { at: 6, data: sseEvent({ kind: 'token' }) }]) });
  createProbe({ global: b.global }).install({ isContent });
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  ({ json } = await b.nextBeacon());
  assert.equal(json.format, 'custom');
  assert.equal(json.t.first_token, 6);
  assert.equal(seen.length, 2);
});

test('an unknown format, or custom without isContent, is refused at install; the options in force stay', async () => {
  const b = fakeBrowser({ respond: () => b.sse([{ at: 4, data: sseEvent({ type: 'content_block_delta', delta: { type: 'text_delta', text: 'Hi' } }) }]) });
  const probe = createProbe({ global: b.global });
  probe.install({ format: 'anthropic', model: 'kept' });
  assert.throws(() => probe.install({ format: 'claude' }), /format claude/);
  assert.throws(() => probe.install({ format: 'custom' }), /format custom/);
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.format, 'anthropic');
  assert.equal(json.model, 'kept');
  assert.equal(json.t.first_token, 4);
  probe.install({ format: 'custom', isContent: () => true });
  probe.install(null);
});

test('a stream of no known shape reports format null and no first token', async () => {
  const b = fakeBrowser({ respond: () => b.sse([{ at: 3, data: sseEvent({ text: 'x', content: 'y' }) }]) });
  createProbe({ global: b.global }).install();
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.format, null);
  assert.equal(json.t.first_token, null);
});
