// Prints the probe's sizes: each source (raw, gzipped) and each minified file the tracer
// serves (raw, gzipped), the stream-format add-on (formats.js) too. The budget: the served
// classic build (/probe/probe.global.js, which is probe.global.min.js) <= 3,200 B gzipped; the
// add-on (/probe/formats.global.js) is served apart, for pages whose streams are not OpenAI's. Minifier: frontend_probe/build.mjs (terser, exact
// version pinned in frontend_probe/package.json, `npm ci` there first); gzip: node:zlib level 9,
// what the server sends (it gzips with the same deflate level).
//   node bench/probe_size.mjs            # exits 1 when over budget
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { gzipSync } from 'node:zlib';
import { minify } from '../frontend_probe/build.mjs';

const PROBE_DIR = new URL('../frontend_probe/', import.meta.url);
// 3,072 B before the probe read tool calls: the first output's kind (the OpenAI rule's tool calls,
// t.first_tool_call, the tool-call hook) measured 3,167 B; every other tool-call byte is in
// the add-on (frontend_probe/README.md).
export const BUDGET_MIN_GZIP_BYTES = 3200;

export const gzipBytes = s => gzipSync(Buffer.from(s), { level: 9 }).length;

/** {raw, minified, gzipped, min_gzipped, minifier} byte sizes of one source text. */
export async function measure(source, { module = false, name } = {}) {
  const version = createRequire(PROBE_DIR)('terser/package.json').version;
  const min = await minify(source, { module, name });
  return {
    raw: Buffer.byteLength(source),
    gzipped: gzipBytes(source),
    minified: Buffer.byteLength(min),
    min_gzipped: gzipBytes(min),
    minifier: `terser ${version} (compress passes=2, mangle)`,
  };
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const read = f => readFileSync(new URL(f, PROBE_DIR), 'utf8');
  let served;
  for (const [src, min, url, module] of [['probe.global.js', 'probe.global.min.js', '/probe/probe.global.js', false],
    ['probe.js', 'probe.min.js', '/probe/probe.js', true],
    ['formats.global.js', 'formats.global.min.js', '/probe/formats.global.js', false],
    ['formats.js', 'formats.min.js', '/probe/formats.js', true]]) {
    const s = await measure(read(src), { module, name: src.replace('.global', '') });
    console.log(`${src}: raw ${s.raw} B, gzip ${s.gzipped} B, minified ${s.minified} B, min+gzip ${s.min_gzipped} B`);
    const committed = read(min);
    const fresh = Buffer.byteLength(committed) == s.minified ? '' : ' (STALE: run `npm run build`)';
    console.log(`  served at ${url}: ${min}, ${Buffer.byteLength(committed)} B, gzip ${gzipBytes(committed)} B${fresh}`);
    served ??= gzipBytes(committed);
  }
  console.log(`minifier: ${(await measure('')).minifier}; gzip: node:zlib level 9`);
  console.log(`budget (served classic build, gzipped): ${BUDGET_MIN_GZIP_BYTES} B -> ${served <= BUDGET_MIN_GZIP_BYTES ? 'ok' : 'OVER'}`);
  process.exitCode = served <= BUDGET_MIN_GZIP_BYTES ? 0 : 1;
}
