import { test } from 'node:test';
import assert from 'node:assert/strict';
import vm from 'node:vm';
import { buildAll, buildClassic, buildClassicAddon, bundle, readSources } from '../build.mjs';
import { measure, gzipBytes, BUDGET_MIN_GZIP_BYTES } from '../../bench/probe_size.mjs';
import { fakeBrowser, delta, readAll, sseEvent } from '../testing/fake_browser.mjs';

test('the committed probe.js is the one-file module of src/ (run `npm run build`)', async () => {
  assert.equal(readSources().module, bundle());
  // what src/probe.js exports, and only that: the inlined modules' other exports are not
  const [flat, entry] = await Promise.all([import('../probe.js'), import('../src/probe.js')]);
  assert.deepEqual(Object.keys(flat).sort(), Object.keys(entry).sort());
  assert.match(readSources().module, /^\/\/ Generated from src\/ by build\.mjs[^\n]*\n\/\/ ttftscope browser probe:/);
});

test('the inlining refuses what it cannot keep the meaning of', () => {
  const files = srcs => f => srcs[f] ?? assert.fail(`read ${f}`);
  const make = (a, b = 'export const b = 1;\n') => () => bundle('a.js', files({ 'a.js': a, 'b.js': b }));
  assert.throws(make("import { b as c } from './b.js';\n"), /unsupported import name b as c/);
  assert.throws(make("import * as b from './b.js';\n"), /unsupported import/);
  assert.throws(make("import { c } from './b.js';\n"), /b\.js does not export c/);
  assert.throws(make("import { b } from './b.js';\nexport { b };\n"), /unsupported export form/);
  assert.throws(make("import { b } from './b.js';\n", "import { a } from './a.js';\nexport const b = 1;\n"), /import cycle/);
  // the inlined module's own exports stay exported only where the entry re-exports them
  const flat = bundle('a.js', files({ 'a.js': "export { b } from './b.js';\n", 'b.js': 'export const b = 1;\nexport function c() {}\n' }));
  assert.match(flat, /^export const b = 1;\nfunction c\(\) \{\}$/m);
});

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

test('the served classic build is within its budget gzipped (bench/probe_size.mjs: 3,200 B since the tool calls of issue 37)', async () => {
  const served = gzipBytes(readSources().classicMin);
  assert.ok(served <= BUDGET_MIN_GZIP_BYTES, `${served} B > ${BUDGET_MIN_GZIP_BYTES} B`);
  const size = await measure(readSources().classic);
  assert.equal(size.min_gzipped, served);
  assert.ok(size.minified < size.raw && size.min_gzipped < size.gzipped); // the minifier did run
});

test('the committed add-on builds (formats.*) are exactly what build.mjs makes now', async () => {
  const src = readSources(), built = await buildAll(src.module, src.formats);
  assert.equal(src.formatsClassic, built['formats.global.js']);
  assert.equal(src.formatsModuleMin, built['formats.min.js']);
  assert.equal(src.formatsClassicMin, built['formats.global.min.js']);
  assert.match(src.formatsClassicMin, /^\/\*! @ttftscope\/probe 0\.1\.0 \(minified by build\.mjs from formats\.js\) \*\/\n/);
  assert.throws(() => buildClassicAddon('export const X = 1;\n'), /expected import/);
});

for (const [probe, addon] of [['classic', 'formatsClassic'], ['classicMin', 'formatsClassicMin']]) test(`the ${addon} add-on, run after the ${probe} probe as plain scripts, adds the formats`, async () => {
  const anthropic = sseEvent({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } });
  const b = fakeBrowser({ respond: () => b.sse([{ at: 7, data: anthropic }]) });
  const context = vm.createContext({
    ...b.global, globalThis: undefined, URL, Headers, Response, ReadableStream, TextDecoder, Blob, Math, JSON,
  });
  context.globalThis = context;
  // without the probe first, the add-on says so instead of failing later
  assert.throws(() => vm.runInContext(readSources()[addon], context), /load probe\.global\.js first/);
  vm.runInContext(readSources()[probe], context);
  assert.throws(() => context.TTFTProbe.install({ format: 'anthropic' }), /format anthropic/);
  vm.runInContext(readSources()[addon], context);
  context.TTFTProbe.install({ format: 'anthropic' }).install();
  await readAll(await context.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.format, 'anthropic');
  assert.equal(json.t.first_token, 7);
});
