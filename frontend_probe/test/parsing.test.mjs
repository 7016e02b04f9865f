import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  sseParser, utf8Feed, hasContent, itlStats, newTraceparent, traceIdOf, serverTimingTraceId,
} from '../probe.js';

const collect = () => {
  const got = [];
  return { got, push: sseParser(d => got.push(d)) };
};

test('an event split over three chunks is dispatched once, whole', () => {
  const { got, push } = collect();
  push('data: {"choi');
  push('ces":[{"delta":{"content":"hi"');
  assert.deepEqual(got, []);
  push('}}]}\n\n');
  assert.deepEqual(got, ['{"choices":[{"delta":{"content":"hi"}}]}']);
});

test('\\r\\n, \\r and \\n line endings all end lines, even with \\r\\n split across chunks', () => {
  const { got, push } = collect();
  push('data: a\r\n\r\ndata: b\r');
  push('\n\r');
  push('\ndata: c\r\rdata: d\n\n');
  assert.deepEqual(got, ['a', 'b', 'c', 'd']);
});

test('a trailing \\r is a line end only once the stream ends', () => {
  const { got, push } = collect();
  push('data: x\r\r');
  assert.deepEqual(got, []);
  push('', true);
  assert.deepEqual(got, ['x']);
});

test('comments, other fields and a missing space are handled like the EventSource spec', () => {
  const { got, push } = collect();
  push(': keep-alive\n\nevent: delta\nid: 7\nretry: 10\ndata:no-space\n: mid-event comment\ndata\n\n');
  assert.deepEqual(got, ['no-space\n']);
});

test('multi-line data joins with \\n; [DONE] is passed on as data', () => {
  const { got, push } = collect();
  push('data: {"a":\ndata:  1}\n\ndata: [DONE]\n\n');
  assert.deepEqual(got, ['{"a":\n 1}', '[DONE]']);
});

test('an event not ended by a blank line is never dispatched', () => {
  const { got, push } = collect();
  push('data: partial\n');
  push('', true);
  assert.deepEqual(got, []);
});

test('a UTF-8 character split across two chunks decodes intact', () => {
  const bytes = new TextEncoder().encode('data: {"choices":[{"delta":{"content":"你好🙂"}}]}\n\n');
  const cut = bytes.indexOf(0xe4) + 1; // inside the three bytes of 你
  for (const at of [cut, bytes.length - 8]) { // …and inside the four bytes of 🙂
    const { got, push } = collect();
    const feed = utf8Feed(push);
    feed(bytes.subarray(0, at));
    feed(bytes.subarray(at));
    feed();
    assert.equal(JSON.parse(got[0]).choices[0].delta.content, '你好🙂');
  }
});

test('only non-empty text counts as content: role-only and usage-only chunks do not', () => {
  assert.equal(hasContent({ choices: [{ delta: { role: 'assistant', content: '' } }] }), false);
  assert.equal(hasContent({ choices: [{ delta: { role: 'assistant' } }] }), false);
  assert.equal(hasContent({ choices: [], usage: { completion_tokens: 3 } }), false);
  assert.equal(hasContent({ choices: [{ delta: { content: null }, finish_reason: 'stop' }] }), false);
  assert.equal(hasContent({ choices: [{ delta: { content: 'x' } }] }), true);
  assert.equal(hasContent({ choices: [{ text: ' Paris' }] }), true);
  assert.equal(hasContent({ choices: [{ text: '' }] }), false);
  assert.equal(hasContent({ choices: [{ message: { role: 'assistant', content: 'Hi' } }] }), true);
});

// equal up to float rounding (numpy itself gives 9.25 where this gives 9.249999999999998)
function assertStats(actual, expected) {
  assert.deepEqual(Object.keys(actual), Object.keys(expected));
  for (const k in expected) assert.ok(Math.abs(actual[k] - expected[k]) < 1e-9, `${k}: ${actual[k]} != ${expected[k]}`);
}

test('ITL statistics are exact on a synthetic sequence (numpy linear percentiles)', () => {
  // content arrival times 10, 15, 17, 27, 28 ms -> gaps 5, 2, 10, 1
  assertStats(itlStats([5, 2, 10, 1]), { count: 4, mean: 4.5, p50: 3.5, p95: 9.25, max: 10 });
  assert.deepEqual(itlStats([7]), { count: 1, mean: 7, p50: 7, p95: 7, max: 7 });
  assert.deepEqual(itlStats([]), { count: 0, mean: 0, p50: 0, p95: 0, max: 0 });
  const gaps = Array.from({ length: 21 }, (_, i) => 20 - i); // 20..0, p95 lands on index 19
  assert.deepEqual(itlStats(gaps), { count: 21, mean: 10, p50: 10, p95: 19, max: 20 });
});

test('a new traceparent is well formed and never has an all-zero id', () => {
  let calls = 0;
  // the first two draws are all zero in the trace id, then in the span id
  const fill = a => {
    calls++;
    a.fill(calls == 1 ? 0 : 7);
    if (calls == 2) a.fill(0, 16);
    return a;
  };
  const tp = newTraceparent(fill);
  assert.equal(calls, 3);
  assert.equal(tp, `00-${'07'.repeat(16)}-${'07'.repeat(8)}-01`);
  assert.match(newTraceparent(a => globalThis.crypto.getRandomValues(a)), /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
});

test('trace ids come from valid traceparents only', () => {
  const tid = 'ab'.repeat(16);
  assert.equal(traceIdOf(`00-${tid}-${'cd'.repeat(8)}-01`), tid);
  assert.equal(traceIdOf(`00-${'AB'.repeat(16)}-${'cd'.repeat(8)}-01`), tid);
  assert.equal(traceIdOf(`00-${'0'.repeat(32)}-${'cd'.repeat(8)}-01`), null);
  assert.equal(traceIdOf('garbage'), null);
  assert.equal(traceIdOf(null), null);
});

test('Server-Timing: the trace metric is found among others, quoted or not', () => {
  const tp = `00-${'12'.repeat(16)}-${'34'.repeat(8)}-01`;
  assert.equal(serverTimingTraceId(`trace;desc=${tp}`), '12'.repeat(16));
  assert.equal(serverTimingTraceId(`db;dur=53, app;dur=47.2, trace;desc="${tp}"`), '12'.repeat(16));
  assert.equal(serverTimingTraceId(`trace;dur=0;desc=${tp}, cache;desc=hit`), '12'.repeat(16));
  assert.equal(serverTimingTraceId(`mytrace;desc=${tp}`), null);
  assert.equal(serverTimingTraceId('cache;desc=hit'), null);
  assert.equal(serverTimingTraceId(null), null);
});
