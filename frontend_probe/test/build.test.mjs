import { test } from 'node:test';
import assert from 'node:assert/strict';
import vm from 'node:vm';
import { buildAll, buildClassic, readSources } from '../build.mjs';
import { measure, gzipBytes, BUDGET_MIN_GZIP_BYTES } from '../../bench/probe_size.mjs';
import { fakeBrowser, delta, readAll } from '../testing/fake_browser.mjs';

test('the committed classic build is up to date with probe.js (run `npm run build`)', () => {
  const { module, classic } = readSources();
  assert.equal(classic, buildClassic(module));
});

test('the committed minified builds are exactly what build.mjs makes now (run `npm run build`)', async () => {
  const src = readSources(), built = await buildAll(src.module);
  assert.equal(src.moduleMin, built['probe.min.js']);
  assert.equal(src.classicMin, built['probe.global.min.js']);
  // really minified: much smaller than their sources, no comments left but the banner
  assert.ok(src.classicMin.length < src.classic.length / 2 && src.moduleMin.length < src.module.length / 2);
  assert.equal(src.classicMin.split('/*').length, 2);
  assert.match(src.classicMin, /^\/\*! @ttftscope\/probe [^\n]*\*\/\n!function\(\)\{"use strict";/);
});

test('the build refuses export forms it would silently drop', () => {
  assert.throws(() => buildClassic('const a = 1;\nexport default a;\n'), /unsupported export/);
  assert.throws(() => buildClassic('const a = 1;\nexport { a };\n'), /unsupported export/);
});

for (const file of ['classic', 'classicMin']) test(`the ${file} build, run as a plain script, exposes a working window.TTFTProbe`, async () => {
  const b = fakeBrowser({ respond: () => b.sse([{ at: 4, data: delta('a') }]) });
  const win = b.global;
  const context = vm.createContext({
    ...win, globalThis: undefined, URL, Headers, Response, ReadableStream, TextDecoder, Blob, Math, JSON,
  });
  context.globalThis = context; // a classic script's global is the window itself
  vm.runInContext(readSources()[file], context);
  const probe = context.TTFTProbe;
  assert.equal(probe.version, 'ttftscope-probe/0.1.0');
  probe.install();
  await readAll(await context.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.t.first_token, 4);
  assert.match(json.traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
});

test('the minified ES module exports what probe.js exports, and works', async () => {
  const src = await import('../probe.js'), min = await import('../probe.min.js');
  assert.deepEqual(Object.keys(min).sort(), Object.keys(src).sort());
  const b = fakeBrowser({ respond: () => b.sse([{ at: 6, data: delta('a') }]) });
  min.createProbe({ global: b.global }).install();
  await readAll(await b.global.fetch('/v1/chat/completions', {}));
  assert.equal((await b.nextBeacon()).json.t.first_token, 6);
});

test('the served classic build is within 3 KB gzipped (terser, from devDependencies)', async () => {
  const served = gzipBytes(readSources().classicMin);
  assert.ok(served <= BUDGET_MIN_GZIP_BYTES, `${served} B > ${BUDGET_MIN_GZIP_BYTES} B`);
  const size = await measure(readSources().classic);
  assert.equal(size.min_gzipped, served);
  assert.ok(size.minified < size.raw && size.min_gzipped < size.gzipped); // the minifier did run
});
