// The stream-format rules (formats.js, probe.js RULES) on the recorded streams of every format
// that the Python rule (tracer/record/first_content.py) also reads: tests/fixtures/sse/formats/
// (README.md there). Same files, same expected first content, first reasoning, first tool call,
// tool calls (name, start, ready) and format.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createProbe, RULES, sseParser, utf8Feed } from '../probe.js';
import { FORMAT_RULES } from '../formats.js';
import { fakeBrowser, readAll, sseEvent } from '../testing/fake_browser.mjs';

const FIXTURES = new URL('../../tests/fixtures/sse/formats/', import.meta.url);
const EXPECTED = JSON.parse(readFileSync(new URL('expected.json', FIXTURES), 'utf8'));
const NAMES = Object.keys(EXPECTED).sort();
// The closed set of the beacon's `format` (tracer/web/probe/beacon.py FORMATS).
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
  test(`${name}: the rules find the format, the first content, reasoning and tool call`, () => {
    const { chunks } = recorded(name);
    const [format, kinds] = judge(name, eventsOf(name, chunks));
    assert.equal(format, want.format);
    assert.equal(index(kinds, 1), want.first_content);
    assert.equal(index(kinds, 2), want.first_reasoning);
    assert.equal(index(kinds, 3), want.first_tool_call);
    assert.equal(kinds.filter(k => k == 1).length, want.content_events);
  });

  test(`${name}: each tool call's start and ready events, by its format's tools rule`, () => {
    // one event at a time, its index as its time: the same index rule as first_content
    const { chunks } = recorded(name);
    const rec = {};
    eventsOf(name, chunks).forEach(({ data }, i) => {
      if (name.endsWith('.txt') || data == '[DONE]') return;
      RULES[want.format].tools?.(JSON.parse(data), rec, i);
    });
    assert.deepEqual((rec.tools || []).map(c => [c.name, c.start, c.ready]), want.tool_calls);
  });

  test(`${name}: the probe's beacon: format, first_token, first_reasoning, first_tool_call, tool_calls, chunks`, async () => {
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
    assert.equal(beacon.t.first_tool_call, at(want.first_tool_call));
    // the tool calls, in start order: name, start, ready (null: never complete); none: absent
    const calls = want.tool_calls.map(([n, s, r]) => ({ name: n, start: at(s), ready: at(r) ?? null }));
    assert.deepEqual(beacon.tool_calls, calls.length ? calls : undefined);
    if (calls.length) assert.equal(beacon.tool_calls[0].start, beacon.t.first_tool_call);
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

// --- tool calls: hostile streams, bounded memory, no beacon lost ---------------------------

const toolDelta = (index, name, args = '', choice = 0) => sseEvent({ choices: [{ index: choice,
  delta: { tool_calls: [{ index, ...(name === undefined ? {} : { id: `call_${index}` }), function: { ...(name === undefined ? {} : { name }), arguments: args } }] } }] });

async function beaconOf(events, install) {
  const b = fakeBrowser({ respond: () => b.sse(events) });
  createProbe({ global: b.global, random: () => 0 }).install(install);
  const res = await b.global.fetch('/v1/chat/completions', { method: 'POST', body: '{}' });
  await readAll(res);
  return (await b.nextBeacon()).json;
}

test('an OpenAI tool call: first_tool_call at the delta naming it, ready when the next starts or the choice finishes', async () => {
  const beacon = await beaconOf([
    { at: 5, data: sseEvent({ choices: [{ index: 0, delta: { role: 'assistant', content: null } }] }) },
    { at: 8, data: toolDelta(0, 'get_weather') },
    { at: 9, data: toolDelta(0, undefined, '{"city":') },
    { at: 12, data: toolDelta(0, undefined, '"Paris"}') },
    { at: 15, data: toolDelta(1, 'get_time', '{}') },
    { at: 20, data: sseEvent({ choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }) },
    { at: 21, data: 'data: [DONE]\n\n' },
  ]);
  assert.equal(beacon.t.first_token, null);
  assert.equal(beacon.t.first_tool_call, 8);
  assert.equal(beacon.chunks, 0);
  assert.deepEqual(beacon.tool_calls, [{ name: 'get_weather', start: 8, ready: 15 }, { name: 'get_time', start: 15, ready: 20 }]);
  // the arguments never reach the beacon
  assert.doesNotMatch(JSON.stringify(beacon), /Paris|city/);
});

test('thousands of calls, huge arguments and names: at most 8 calls, names cut to 64, memory bounded, the beacon sent', async () => {
  const events = [];
  for (let i = 0; i < 3000; i++) events.push({ at: 10 + i, data: toolDelta(i, (i % 2 ? 'f' : '\u{1F600}').repeat(5000), 'x'.repeat(1000)) });
  events.push({ at: 5000, data: toolDelta(3000, undefined, '"' + 'y'.repeat(4 << 20) + '"') });
  const beacon = await beaconOf(events);
  assert.equal(beacon.t.first_tool_call, 10);
  assert.equal(beacon.tool_calls.length, 8);
  assert.equal(beacon.probe_errors, 0);
  beacon.tool_calls.forEach((c, i) => {
    assert.ok(c.name.length <= 64 && c.start == 10 + i && c.ready == 11 + i, JSON.stringify(c));
    // cut between characters, never inside a surrogate pair
    assert.equal(c.name, i % 2 ? 'f'.repeat(64) : '\u{1F600}'.repeat(32));
  });
  // what the probe keeps while the stream runs: the listed calls, whatever came after
  const rec = {};
  for (let i = 0; i < 5000; i++) RULES.openai.tools({ choices: [{ index: 0, delta: { tool_calls: [{ index: i, function: { name: 'f' } }] } }] }, rec, i);
  for (let i = 0; i < 5000; i++) RULES['ai-sdk-ui'].tools({ type: 'tool-input-start', toolCallId: `c${i}`, toolName: 'f' }, rec, i);
  for (let i = 0; i < 5000; i++) RULES.gemini.tools({ candidates: [{ content: { parts: [{ functionCall: { name: 'f', args: {} } }] } }] }, rec, i);
  assert.equal(rec.calls.size, 8);
  assert.equal(rec.tools.length, 8);
});

test('a name that is not a string, or no key, is no tool call; deep JSON is one counted error, the beacon still goes', async () => {
  for (const name of [7, ['f'], { x: 'f' }, null, true, '']) {
    const beacon = await beaconOf([{ at: 4, data: toolDelta(0, name) }, { at: 6, data: sseEvent({ choices: [{ delta: { content: 'hi' } }] }) }]);
    assert.equal(beacon.t.first_tool_call, undefined, JSON.stringify(name));
    assert.equal(beacon.tool_calls, undefined);
    assert.equal(beacon.t.first_token, 6);
  }
  const deep = 'data: {"choices":[{"delta":{"tool_calls":' + '['.repeat(200000) + ']'.repeat(200000) + '}}]}\n\n';
  const beacon = await beaconOf([{ at: 3, data: toolDelta(0, 'f') }, { at: 4, data: deep },
    { at: 7, data: sseEvent({ choices: [{ delta: {}, finish_reason: 'tool_calls' }] }) }]);
  assert.deepEqual(beacon.tool_calls, [{ name: 'f', start: 3, ready: 7 }]);
  assert.ok(beacon.probe_errors <= 1);
  // keys: an integer or a short string; anything else is no key
  const rec = {};
  RULES['ai-sdk-ui'].tools({ type: 'tool-input-start', toolCallId: { a: 1 }, toolName: 'f' }, rec, 1);
  RULES['ai-sdk-ui'].tools({ type: 'tool-input-start', toolCallId: 'c'.repeat(129), toolName: 'f' }, rec, 2);
  RULES.openai.tools({ choices: [{ index: [[[]]], delta: { tool_calls: [{ index: true, function: { name: 'f' } }] } }] }, rec, 3);
  assert.deepEqual(rec.tools || [], []);
});

test('each format: a call whose arguments never complete has ready null; text after an OpenAI call makes it ready', async () => {
  const anthropic = await beaconOf([
    { at: 3, data: sseEvent({ type: 'message_start', message: {} }) },
    { at: 5, data: sseEvent({ type: 'content_block_start', index: 0, content_block: { type: 'tool_use', id: 't', name: 'lookup', input: {} } }) },
    { at: 6, data: sseEvent({ type: 'content_block_delta', index: 0, delta: { type: 'input_json_delta', partial_json: '{"q":' } }) },
  ]);
  assert.equal(anthropic.format, 'anthropic');
  assert.deepEqual(anthropic.tool_calls, [{ name: 'lookup', start: 5, ready: null }]);
  const openai = await beaconOf([{ at: 2, data: toolDelta(0, 'f', '{}') }, { at: 9, data: sseEvent({ choices: [{ index: 0, delta: { content: 'Done.' } }] }) }]);
  assert.deepEqual(openai.tool_calls, [{ name: 'f', start: 2, ready: 9 }]);
  assert.equal(openai.t.first_token, 9);
  assert.equal(openai.t.first_tool_call, 2);
});
