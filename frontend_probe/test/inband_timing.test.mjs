// The server's in-band timing (issue 11): the probe asks for it with `X-TTFT-Timing: 1`, reads
// the `: ttft-timing <token>` SSE comment from the stream it already tees, and copies the
// token into the beacon's `server` field; a server that sends none changes nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createProbe, sseParser, timingToken } from '../probe.js';
import { fakeBrowser, delta, readAll } from '../testing/fake_browser.mjs';

const b64url = n => 'Ab-_9'.repeat(Math.ceil(n / 5)).slice(0, n);
const TOKEN = `${b64url(300)}.${b64url(43)}`;
const LINE = `: ttft-timing ${TOKEN}\n\n`;

async function run(steps, probeOpts, init = {}) {
  const b = fakeBrowser({ respond: (_, i) => b.sse(steps, { signal: i && i.signal }) });
  createProbe({ global: b.global, random: () => 0 }).install(probeOpts);
  const bytes = await readAll(await b.global.fetch('/v1/chat/completions', init));
  return { b, bytes: new TextDecoder().decode(bytes), beacon: (await b.nextBeacon()).json,
    sent: new Headers(b.fetches[0].init.headers) };
}

test('timingToken accepts exactly `ttft-timing <base64url>.<43 base64url>`', () => {
  assert.equal(timingToken(` ttft-timing ${TOKEN}`), TOKEN);
  assert.equal(timingToken(`ttft-timing ${TOKEN}`), TOKEN);
  assert.equal(timingToken(` ttft-timing ${b64url(10)}`), null);               // no signature
  assert.equal(timingToken(` ttft-timing ${b64url(10)}.${b64url(42)}`), null);  // short signature
  assert.equal(timingToken(` ttft-timing ${b64url(10)}=.${b64url(43)}`), null); // padding
  assert.equal(timingToken(` ttft-timing ${b64url(2001)}.${b64url(43)}`), null); // too long
  assert.equal(timingToken(` ttft-timing ${TOKEN} x`), null);
  assert.equal(timingToken(` keepalive`), null);
});

test('sseParser hands comment lines to onComment and never makes them events', () => {
  const data = [], comments = [];
  const push = sseParser(d => data.push(d), c => comments.push(c));
  push(': hello\r\ndata: 1\n\n:');
  push('x\n\n', true);
  assert.deepEqual(data, ['1']);
  assert.deepEqual(comments, [' hello', 'x']);
});

test('a probed request sends X-TTFT-Timing: 1; the token, split across chunks, reaches the beacon', async () => {
  const { beacon, bytes, sent } = await run([
    { at: 5, data: delta('hi') },
    { at: 8, data: LINE.slice(0, 40) },
    { at: 9, data: LINE.slice(40) + 'data: [DONE]\n\n' },
  ]);
  assert.equal(sent.get('x-ttft-timing'), '1');
  assert.equal(beacon.server, TOKEN);
  assert.equal(beacon.chunks, 1);
  assert.equal(beacon.probe_errors, 0);
  assert.equal(bytes, delta('hi') + LINE + 'data: [DONE]\n\n'); // the page gets every byte
});

test('a server that sends no timing line: no `server` field, nothing else changes', async () => {
  const { beacon } = await run([{ at: 5, data: delta('hi') }, { at: 9, data: ': ping\n\ndata: [DONE]\n\n' }]);
  assert.equal('server' in beacon, false);
  assert.equal(beacon.t.first_token, 5);
  assert.equal(beacon.probe_errors, 0);
});

test('the last timing line counts (the nearest hop writes it); a malformed one is ignored', async () => {
  const upstream = `${b64url(20)}.${b64url(43)}`;
  const { beacon } = await run([
    { at: 3, data: `: ttft-timing ${upstream}\n\n` },
    { at: 5, data: delta('hi') + LINE + `: ttft-timing not-a-token\n\n` },
  ]);
  assert.equal(beacon.server, TOKEN);
});

test('timing: false sends no header; a header the caller set is left as it is', async () => {
  assert.equal((await run([{ at: 5, data: delta('a') }], { timing: false })).sent.has('x-ttft-timing'), false);
  const own = await run([{ at: 5, data: delta('a') }], {}, { headers: { 'X-TTFT-Timing': '0' } });
  assert.equal(own.sent.get('x-ttft-timing'), '0');
});

test('an unsampled request gets no header at all', async () => {
  const b = fakeBrowser({ respond: () => b.sse([{ at: 5, data: delta('a') }]) });
  createProbe({ global: b.global, random: () => 0.9 }).install({ sampleRate: 0.5 });
  await readAll(await b.global.fetch('/v1/chat/completions', { headers: { a: 'b' } }));
  assert.deepEqual(b.fetches[0].init, { headers: { a: 'b' } });
});

test('the page cancelling the body right after [DONE] (what the openai SDK does) is ok', async () => {
  // the server has not closed the stream yet when the SDK, having read [DONE], cancels it
  const cancels = [];
  const open = first => new Response(new ReadableStream({
    start: c => c.enqueue(new TextEncoder().encode(first)),
    cancel: r => void cancels.push(r),
  }), { headers: { 'content-type': 'text/event-stream' } });
  for (const [body, outcome] of [[delta('a') + LINE + 'data: [DONE]\n\n', 'ok'], [delta('a'), 'aborted']]) {
    const b = fakeBrowser({ respond: () => open(body) });
    createProbe({ global: b.global }).install();
    const reader = (await b.global.fetch('/v1/chat/completions', {})).body.getReader();
    await reader.read();
    await reader.cancel('done');
    const { json } = await b.nextBeacon();
    assert.equal(json.outcome, outcome);
    assert.equal(json.chunks, 1);
  }
  assert.deepEqual(cancels, ['done', 'done']);
});
