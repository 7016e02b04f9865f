// server.js checks what it forwards from the browser's request (issue 39): `traceparent` as
// W3C Trace Context reads it (Level 2, "traceparent Header" and "Versioning of
// traceparent"), dropped with its `tracestate` when invalid; a header value that no HTTP
// message may carry (CR, LF, NUL) refused with a clear error, the request going on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { headersOf, traceparentOf, ttftJoin } from '../server.js';

const TRACE = '4b'.repeat(16), PARENT = '0f'.repeat(8);
const TP = `00-${TRACE}-${PARENT}-01`;

// What the engine call carries, through a fetch that answers at once.
async function forwarded(browserHeaders) {
  let seen;
  const join = ttftJoin(browserHeaders, { fetch: async (input, init) => {
    seen = init.headers;
    return new Response('ok');
  } });
  await join.fetch('http://engine.test/v1/chat/completions', { method: 'POST' });
  return { seen, join };
}

test('a valid version-00 traceparent is forwarded unchanged, with its tracestate', async () => {
  for (const tp of [TP, `00-${TRACE}-${PARENT}-00`, `00-${TRACE}-${PARENT}-ff`]) {
    const { seen } = await forwarded({ traceparent: tp, tracestate: 'k=v' });
    assert.equal(seen.get('traceparent'), tp);
    assert.equal(seen.get('tracestate'), 'k=v');
  }
});

test('an invalid traceparent is dropped, and its tracestate with it', async () => {
  const invalid = {
    'the 12 KB of the report': 'a'.repeat(12 << 10),
    'version 00 with a tail': TP + '-' + 'a'.repeat(12 << 10),
    'version 00 one longer': TP + '0',
    'version ff': `ff-${TRACE}-${PARENT}-01`,
    'version not hex': `0g-${TRACE}-${PARENT}-01`,
    'version upper case': `0A-${TRACE}-${PARENT}-01`,
    'trace id upper case': `00-${TRACE.toUpperCase()}-${PARENT}-01`,
    'parent id upper case': `00-${TRACE}-${PARENT.toUpperCase()}-01`,
    'flags upper case': `00-${TRACE}-${PARENT}-0A`,
    'all-zero trace id': `00-${'0'.repeat(32)}-${PARENT}-01`,
    'all-zero parent id': `00-${TRACE}-${'0'.repeat(16)}-01`,
    'short trace id': `00-${TRACE.slice(1)}-${PARENT}-01`,
    'short parent id': `00-${TRACE}-${PARENT.slice(1)}-01`,
    'one-digit flags': `00-${TRACE}-${PARENT}-1`,
    'wrong separator': `00_${TRACE}-${PARENT}-01`,
    'future version, 54 characters': `cc-${TRACE}-${PARENT}-0`,
    'future version, no dash after the flags': `cc-${TRACE}-${PARENT}-01x`,
    'future version, bad trace id': `cc-${'z'.repeat(32)}-${PARENT}-01`,
    'future version, all-zero parent id': `cc-${TRACE}-${'0'.repeat(16)}-01-ab`,
  };
  for (const [why, tp] of Object.entries(invalid)) {
    const { seen } = await forwarded({ traceparent: tp, tracestate: 'k=v', 'x-ttft-timing': '1' });
    assert.equal(seen.get('traceparent'), null, why);
    assert.equal(seen.get('tracestate'), null, why);       // no tracestate without its parent
    assert.equal(seen.get('x-ttft-timing'), '1', why);     // the rest goes on
    assert.equal(traceparentOf(tp), null, why);
  }
  assert.equal((await forwarded({ tracestate: 'k=v' })).seen.get('tracestate'), null);
});

test('a later version is read by the version-00 rules and sent as version 00', async () => {
  const cases = [
    [`cc-${TRACE}-${PARENT}-01`, TP],                               // 55 characters
    [`01-${TRACE}-${PARENT}-03-what-comes-later`, TP],              // only the sampled bit
    [`fe-${TRACE}-${PARENT}-00-` + 'a'.repeat(12 << 10), `00-${TRACE}-${PARENT}-00`],
  ];
  for (const [tp, sent] of cases) {
    assert.equal(traceparentOf(tp), sent, tp.slice(0, 60));
    const { seen } = await forwarded({ traceparent: tp, tracestate: 'k=v' });
    assert.equal(seen.get('traceparent'), sent);
    assert.equal(seen.get('tracestate'), 'k=v');
  }
});

test('a header value with CR or LF is refused with a clear error; the request goes on', async () => {
  const browser = { traceparent: TP, 'x-injected': 'a\r\nx-evil: 1', 'x-list': ['ok', 'b\nc'],
    'x-nul': 'a\0b', 'bad name': 'v' };
  assert.doesNotThrow(() => headersOf(browser));
  const refused = [];
  const h = headersOf({ headers: browser }, e => refused.push(e));
  assert.equal(h.get('traceparent'), TP);
  assert.deepEqual(refused.map(e => e.header), ['x-injected', 'x-list', 'x-nul', 'bad name']);
  assert.match(refused[0].message, /header "x-injected" refused: .*CR, LF or NUL/);
  assert.match(refused[3].message, /header "bad name" refused: .*not a valid field name/);

  const { seen, join } = await forwarded({ traceparent: TP, 'x-ttft-timing': 'a\r\nb' });
  assert.equal(seen.get('traceparent'), TP);               // forwarded, the request alive
  assert.equal(seen.get('x-ttft-timing'), null);           // the refused one is not
  assert.deepEqual(join.refused.map(e => e.header), ['x-ttft-timing']);
  assert.ok(join.refused[0] instanceof TypeError);
});
