// server.js, the backend helper: header forwarding on the backend's own engine call, the
// engine's Server-Timing and in-band token carried to the backend's response, and the token
// written where the probe reads it. Real AI SDK (ai, @ai-sdk/openai), openai and
// @anthropic-ai/sdk clients as the backend's engine clients, against a loopback fake engine.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { headersOf, ttftJoin, writeTo } from '../server.js';
import { createProbe } from '../probe.js';
import '../formats.js';
import { fakeBrowser, readAll } from '../testing/fake_browser.mjs';

const TOKEN = 'eyJ2IjoxLCJ0cmFjZV9pZCI6ImFiIn0.' + 'Q'.repeat(43);
const TP = `00-${'4b'.repeat(16)}-${'0f'.repeat(8)}-01`;
const ST = `trace;desc="${TP}", beacon;desc=${'c3'.repeat(32)}`;
const enc = new TextEncoder(), dec = new TextDecoder();
const chunk = delta => 'data: ' + JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm',
  choices: [{ index: 0, delta, finish_reason: null }] }) + '\n\n';
const ENGINE_BODY = chunk({ role: 'assistant', content: '' }) + chunk({ content: 'Paris' }) +
  chunk({ content: ' it is' }) + `: ttft-timing ${TOKEN}\n\n` + 'data: [DONE]\n\n';

const bodyOf = (pieces, type = 'text/event-stream', headers = {}) => new Response(new ReadableStream({
  start(c) {
    for (const p of pieces) c.enqueue(typeof p == 'string' ? enc.encode(p) : p);
    c.close();
  },
}), { headers: { 'content-type': type, ...headers } });
const bytewise = s => Array.from(enc.encode(s), b => new Uint8Array([b]));

// A loopback engine: records each request's headers, answers `body` with Server-Timing.
async function engine(body = ENGINE_BODY, type = 'text/event-stream') {
  const seen = [];
  const server = http.createServer((req, res) => {
    seen.push(req.headers);
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': type, 'server-timing': ST });
      // the token comment split across writes, as any network may split it
      const cut = body.indexOf(': ttft-timing') + 7;
      res.write(body.slice(0, cut));
      setImmediate(() => res.end(body.slice(cut)));
    });
  });
  await new Promise(r => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, seen, close: () => server.close() };
}

const browserRequest = (extra = {}) => new Request('http://backend.test/api/chat', {
  method: 'POST', body: '{}', headers: { traceparent: TP, 'x-ttft-timing': '1', tracestate: 'k=v', cookie: 'secret', ...extra },
});

test('headersOf reads a Fetch Request, Headers, a Node IncomingMessage and a plain object', () => {
  const node = { headers: { traceparent: TP, 'x-many': ['a', 'b'], 'x-n': 5 } };
  assert.equal(headersOf(node).get('traceparent'), TP);
  assert.equal(headersOf(node).get('x-many'), 'a, b');
  assert.equal(headersOf(node).get('x-n'), null);
  assert.equal(headersOf(browserRequest()).get('tracestate'), 'k=v');
  assert.equal(headersOf(new Headers({ a: '1' })).get('a'), '1');
  assert.equal(headersOf({ traceparent: TP }).get('traceparent'), TP);
  assert.equal(headersOf(undefined).get('traceparent'), null);
});

test('join.fetch forwards the three headers (never the cookie), keeps the caller\'s own, and reads the engine\'s timing', async () => {
  const e = await engine();
  try {
    const join = ttftJoin(browserRequest());
    const res = await join.fetch(`${e.url}/v1/chat/completions`, { method: 'POST', body: '{}',
      headers: { tracestate: 'mine=1', authorization: 'Bearer k' } });
    assert.equal(await res.text(), ENGINE_BODY);      // the body is untouched
    assert.equal(e.seen[0].traceparent, TP);
    assert.equal(e.seen[0]['x-ttft-timing'], '1');
    assert.equal(e.seen[0].tracestate, 'mine=1');
    assert.equal(e.seen[0].authorization, 'Bearer k');
    assert.equal(e.seen[0].cookie, undefined);
    assert.equal(join.serverTiming, ST);
    assert.equal(join.token, TOKEN);
    assert.deepEqual(join.part(), { type: 'data-ttft-timing', data: TOKEN, transient: true });
  } finally {
    e.close();
  }
});

test('the tap finds the token however the reads cut it, and ignores look-alikes and long lines', async () => {
  for (const pieces of [[ENGINE_BODY], bytewise(ENGINE_BODY), [ENGINE_BODY.replace(/\n/g, '\r\n')]]) {
    const join = ttftJoin({}, { fetch: async () => bodyOf(pieces) });
    await readAll(await join.fetch('http://e/'));
    assert.equal(join.token, TOKEN);
  }
  const fake = [`data: ": ttft-timing ${TOKEN}"\n\n`, `: ttft-timing x.y\n\n`, `: ttft-timing ${'a'.repeat(3000)}.${'b'.repeat(43)}\n\n`];
  const join = ttftJoin({}, { fetch: async () => bodyOf(fake) });
  await readAll(await join.fetch('http://e/'));
  assert.equal(join.token, null);
  assert.equal(join.part(), null);
});

for (const [name, split] of [['one read', s => [s]], ['byte by byte', bytewise]]) {
  test(`respond(): the SSE comment before [DONE], Server-Timing copied, nothing else changed (${name})`, async () => {
    const join = ttftJoin(browserRequest(), { fetch: async () => bodyOf([ENGINE_BODY], 'text/event-stream', { 'server-timing': ST }) });
    await readAll(await join.fetch('http://e/'));
    const mine = 'data: {"x":1}\n\ndata: [DONE]\n\n';
    const out = await join.respond(bodyOf(split(mine), 'text/event-stream', { 'server-timing': 'app;dur=1' }));
    assert.equal(out.headers.get('server-timing'), `app;dur=1, ${ST}`);
    assert.equal(await out.text(), `data: {"x":1}\n\n: ttft-timing ${TOKEN}\n\ndata: [DONE]\n\n`);
  });

  test(`respond(): the AI SDK UI stream gets the data part; text/plain is untouched (${name})`, async () => {
    const join = ttftJoin(browserRequest(), { fetch: async () => bodyOf([ENGINE_BODY]) });
    await readAll(await join.fetch('http://e/'));
    const ui = 'data: {"type":"start"}\n\ndata: {"type":"text-delta","id":"0","delta":"data: [DONE]"}\n\ndata: [DONE]\n\n';
    let out = await join.respond(bodyOf(split(ui), 'text/event-stream', { 'x-vercel-ai-ui-message-stream': 'v1' }));
    assert.equal(await out.text(), ui.replace('data: [DONE]\n\n', '') +
      `data: {"type":"data-ttft-timing","data":"${TOKEN}","transient":true}\n\ndata: [DONE]\n\n`);
    out = await join.respond(bodyOf(split('Paris data: [DONE]\n\n'), 'text/plain; charset=utf-8'));
    assert.equal(await out.text(), 'Paris data: [DONE]\n\n');
  });
}

test('respond(): without [DONE] the token ends the stream, unless it broke off mid-event; never twice', async () => {
  const join = ttftJoin({}, { fetch: async () => bodyOf([ENGINE_BODY]) });
  await readAll(await join.fetch('http://e/'));
  const sse = s => join.respond(bodyOf([s])).then(r => r.text());
  assert.equal(await sse('data: a\n\n'), `data: a\n\n: ttft-timing ${TOKEN}\n\n`);
  assert.equal(await sse('data: a\n\ndata: b'), 'data: a\n\ndata: b');
  assert.equal(await sse('data: a\r\n\r\ndata:[DONE]\r\n\r\n'), `data: a\r\n\r\n: ttft-timing ${TOKEN}\n\ndata:[DONE]\r\n\r\n`);
  // a second [DONE] event (a stream of two answers) gets nothing more
  const two = await sse('data: [DONE]\n\ndata: [DONE]\n\n');
  assert.equal(two.split('ttft-timing').length, 2);
  // [DONE] inside an event is not the end of the stream
  assert.equal(await sse('data: x\ndata: [DONE]\n\n'), `data: x\ndata: [DONE]\n\n: ttft-timing ${TOKEN}\n\n`);
});

test('respond() waits for the engine\'s headers, at most waitMs, and a failed engine call ends the wait', async () => {
  let release;
  const join = ttftJoin({}, { fetch: () => new Promise(r => (release = r)) });
  const pending = join.fetch('http://e/');
  let done = false;
  const answer = join.respond(bodyOf(['data: [DONE]\n\n'])).then(r => ((done = true), r));
  await new Promise(r => setImmediate(r));
  assert.equal(done, false);
  release(bodyOf([ENGINE_BODY], 'text/event-stream', { 'server-timing': ST }));
  await readAll(await pending);
  assert.equal((await answer).headers.get('server-timing'), ST);

  const never = ttftJoin({}, { waitMs: 5 });
  assert.equal((await never.respond(bodyOf(['data: [DONE]\n\n']))).headers.get('server-timing'), null);
  const failing = ttftJoin({}, { fetch: async () => { throw new TypeError('refused'); }, waitMs: 60000 });
  await assert.rejects(failing.fetch('http://e/'), /refused/);
  assert.equal(await (await failing.respond(bodyOf(['data: [DONE]\n\n']))).text(), 'data: [DONE]\n\n');
});

// The whole backend with the real AI SDK: streamText over the helper's fetch, its UI message
// stream or text stream response, read by the real probe (with the format add-on).
async function probeRead(res) {
  const b = fakeBrowser({ respond: () => res });
  createProbe({ global: b.global }).install({ match: '/api/chat' });
  await readAll(await b.global.fetch('/api/chat', { method: 'POST', body: '{}' }));
  return (await b.nextBeacon()).json;
}

test('the real AI SDK backend: the UI message stream carries the engine\'s token and trace to the probe', async () => {
  const e = await engine();
  try {
    const join = ttftJoin(browserRequest());
    const openai = createOpenAI({ baseURL: `${e.url}/v1`, apiKey: 'k', fetch: join.fetch });
    const result = streamText({ model: openai.chat('m'), prompt: 'capital of France?' });
    const res = await join.respond(result.toUIMessageStreamResponse());
    assert.equal(e.seen[0].traceparent, TP);
    assert.equal(res.headers.get('server-timing'), ST);
    const beacon = await probeRead(res);
    assert.equal(beacon.format, 'ai-sdk-ui');
    assert.equal(beacon.server, TOKEN);
    assert.equal(beacon.token, 'c3'.repeat(32));
    assert.equal(beacon.trace_id, '4b'.repeat(16));
    assert.equal(beacon.chunks, 2);
    assert.notEqual(beacon.t.first_token, null);
  } finally {
    e.close();
  }
});

test('the real AI SDK text stream: Server-Timing reaches the probe, the body stays plain text', async () => {
  const e = await engine();
  try {
    const join = ttftJoin(browserRequest());
    const openai = createOpenAI({ baseURL: `${e.url}/v1`, apiKey: 'k', fetch: join.fetch });
    const res = await join.respond(streamText({ model: openai.chat('m'), prompt: 'q' }).toTextStreamResponse());
    const beacon = await probeRead(res);
    assert.equal(beacon.format, 'text');
    assert.equal(beacon.token, 'c3'.repeat(32));
    assert.equal(beacon.server, undefined);
    assert.ok(beacon.chunks >= 1 && beacon.t.first_token != null);
  } finally {
    e.close();
  }
});

test('join.fetch fits the openai and @anthropic-ai/sdk clients\' fetch option', async () => {
  const anthropicBody = [
    { type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', model: 'c', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 } } },
    { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } },
    { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Paris' } },
    { type: 'content_block_stop', index: 0 },
    { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 2 } },
    { type: 'message_stop' },
  ].map(j => `event: ${j.type}\ndata: ${JSON.stringify(j)}\n\n`).join('') + `: ttft-timing ${TOKEN}\n\n`;
  for (const [body, call] of [
    [ENGINE_BODY, async (url, fetch) => {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'k', fetch });
      let text = '';
      for await (const c of await client.chat.completions.create({ model: 'm', messages: [], stream: true })) text += c.choices[0]?.delta?.content || '';
      return text;
    }],
    [anthropicBody, async (url, fetch) => {
      const client = new Anthropic({ baseURL: url, apiKey: 'k', fetch });
      let text = '';
      for await (const ev of await client.messages.create({ model: 'c', max_tokens: 8, messages: [{ role: 'user', content: 'q' }], stream: true })) {
        if (ev.type == 'content_block_delta' && ev.delta.type == 'text_delta') text += ev.delta.text;
      }
      return text;
    }],
  ]) {
    const e = await engine(body);
    try {
      const join = ttftJoin(browserRequest());
      assert.equal(await call(e.url, join.fetch), 'Paris' + (body == ENGINE_BODY ? ' it is' : ''));
      assert.equal(e.seen[0].traceparent, TP);
      assert.equal(join.token, TOKEN);
      assert.equal(join.serverTiming, ST);
    } finally {
      e.close();
    }
  }
});

test('writeTo streams a Response into a node:http response, headers first', async () => {
  const server = http.createServer((req, res) => writeTo(res, bodyOf(['data: a\n\n', 'data: [DONE]\n\n'], 'text/event-stream', { 'server-timing': ST })));
  await new Promise(r => server.listen(0, '127.0.0.1', r));
  try {
    const res = await fetch(`http://127.0.0.1:${server.address().port}/`);
    assert.equal(res.headers.get('server-timing'), ST);
    assert.equal(await res.text(), 'data: a\n\ndata: [DONE]\n\n');
  } finally {
    server.close();
  }
});
