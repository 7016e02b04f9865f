import { test } from 'node:test';
import assert from 'node:assert/strict';
import vm from 'node:vm';
import { buildClassic, readSources } from '../build.mjs';
import { measure, BUDGET_MIN_GZIP_BYTES } from '../../bench/probe_size.mjs';
import { fakeBrowser, delta, readAll } from '../testing/fake_browser.mjs';

test('the committed classic build is up to date with probe.js (run `npm run build`)', () => {
  const { module, classic } = readSources();
  assert.equal(classic, buildClassic(module));
});

test('the build refuses export forms it would silently drop', () => {
  assert.throws(() => buildClassic('const a = 1;\nexport default a;\n'), /unsupported export/);
  assert.throws(() => buildClassic('const a = 1;\nexport { a };\n'), /unsupported export/);
});

test('the classic build, run as a plain script, exposes a working window.TTFTProbe', async () => {
  const b = fakeBrowser({ respond: () => b.sse([{ at: 4, data: delta('a') }]) });
  const win = b.global;
  const context = vm.createContext({
    ...win, globalThis: undefined, URL, Headers, Response, ReadableStream, TextDecoder, Blob, Math, JSON,
  });
  context.globalThis = context; // a classic script's global is the window itself
  vm.runInContext(readSources().classic, context);
  const probe = context.TTFTProbe;
  assert.equal(probe.version, 'ttftscope-probe/0.1.0');
  probe.install();
  await readAll(await context.fetch('/v1/chat/completions', {}));
  const { json } = await b.nextBeacon();
  assert.equal(json.t.first_token, 4);
  assert.match(json.traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
});

test('the classic build is within 3 KB minified + gzipped (terser, from devDependencies)', async () => {
  const size = await measure(readSources().classic);
  assert.ok(size.min_gzipped <= BUDGET_MIN_GZIP_BYTES, `${size.min_gzipped} B > ${BUDGET_MIN_GZIP_BYTES} B`);
  assert.ok(size.minified < size.raw && size.min_gzipped < size.gzipped); // the minifier did run
});
