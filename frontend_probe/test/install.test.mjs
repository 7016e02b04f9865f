import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createProbe } from '../probe.js';
import { fakeBrowser, delta, readAll } from '../testing/fake_browser.mjs';

const traced = f => new Headers(f.init && f.init.headers).has('traceparent');

function setup(browserOpts) {
  const b = fakeBrowser({ respond: () => b.sse([{ at: 4, data: delta('a') }]), ...browserOpts });
  return { b, probe: createProbe({ global: b.global }), native: b.global.fetch };
}

async function call(b, url) {
  await readAll(await b.global.fetch(url, {}));
  return traced(b.fetches.at(-1));
}

test('install wraps fetch once; uninstall restores the original function', async () => {
  const { b, probe, native } = setup();
  probe.install();
  const wrapped = b.global.fetch;
  assert.notEqual(wrapped, native);
  probe.install({ sampleRate: 1 });
  assert.equal(b.global.fetch, wrapped);
  assert.equal(await call(b, '/v1/chat/completions'), true);
  await b.nextBeacon();
  assert.equal(b.fetches.filter(f => !f.init.keepalive).length, 1);
  probe.uninstall();
  assert.equal(b.global.fetch, native);
  assert.equal(await call(b, '/v1/chat/completions'), false);
});

test('uninstall under a later wrapper turns the probe into a pass-through', async () => {
  const { b, probe } = setup();
  probe.install();
  const ours = b.global.fetch;
  const theirs = (input, init) => ours(input, init);
  b.global.fetch = theirs;
  probe.uninstall();
  assert.equal(b.global.fetch, theirs);
  assert.equal(await call(b, '/v1/chat/completions'), false);
});

test('default match: same-origin chat/completions and completions paths only', async () => {
  const { b, probe } = setup({});
  b.global.location = { href: 'https://chat.example/app/' };
  probe.install();
  assert.equal(await call(b, '/v1/chat/completions'), true);
  assert.equal(await call(b, 'https://chat.example/v1/completions?x=1'), true);
  assert.equal(await call(b, 'v1/chat/completions'), true); // relative to the page
  assert.equal(await call(b, new URL('https://chat.example/api/chat/completions')), true);
  assert.equal(await call(b, '/v1/models'), false);
  assert.equal(await call(b, '/v1/chat/completions/x'), false);
  // cross-origin requests get a preflight-triggering header only when `match` opts in
  assert.equal(await call(b, 'https://api.other.example/v1/chat/completions'), false);
  const beacons = [];
  for (let i = 0; i < 4; i++) beacons.push((await b.nextBeacon()).json.url_path);
  assert.deepEqual(beacons, ['/v1/chat/completions', '/v1/completions', '/app/v1/chat/completions', '/api/chat/completions']);
});

test('match as a string prefix, a RegExp or a function', async () => {
  const { b, probe } = setup();
  probe.install({ match: '/api/' });
  assert.equal(await call(b, '/api/generate'), true);
  assert.equal(await call(b, 'http://localhost/api/x'), true);
  assert.equal(await call(b, '/v1/chat/completions'), false);
  probe.install({ match: /^https:\/\/llm\.example\/.*\/stream$/ });
  assert.equal(await call(b, 'https://llm.example/v2/stream'), true);
  assert.equal(await call(b, 'https://llm.example/v2/other'), false);
  const seen = [];
  probe.install({ match: url => (seen.push(url), url.includes('yes')) });
  assert.equal(await call(b, '/yes'), true);
  assert.equal(await call(b, '/no'), false);
  assert.deepEqual(seen, ['http://localhost/yes', 'http://localhost/no']);
});

test('TTFTProbe.fetch probes whatever `match` says, without installing', async () => {
  const { b, probe, native } = setup();
  const res = await probe.fetch('/not/matched', {});
  assert.equal(b.global.fetch, native);
  await readAll(res);
  assert.equal(traced(b.fetches[0]), true);
  assert.equal((await b.nextBeacon()).json.url_path, '/not/matched');
});

test('the beacon itself is never probed, even when `match` matches everything', async () => {
  const { b, probe } = setup({ sendBeacon: false });
  probe.install({ match: () => true });
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.outcome, 'ok');
  const post = b.fetches.at(-1);
  assert.equal(post.input, '/v1/probe');
  assert.equal(traced(post), false);
});

test('a header value the browser rejects: the native fetch decides, untouched', async () => {
  const { b, probe } = setup();
  probe.install();
  const init = { headers: { 'bad header': 'x' } };
  await readAll(await b.global.fetch('/v1/chat/completions', init));
  assert.equal(b.fetches[0].init, init);
});
