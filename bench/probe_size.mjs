// Prints the probe's raw, minified and gzipped sizes (the budget: <= 3 KB min+gzip for the
// classic build). Minifier: terser (exact version pinned in frontend_probe/package.json,
// `npm ci` there first) with compress + mangle; gzip: node:zlib level 9.
//   node bench/probe_size.mjs            # exits 1 when over budget
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { gzipSync } from 'node:zlib';

const PROBE_DIR = new URL('../frontend_probe/', import.meta.url);
export const BUDGET_MIN_GZIP_BYTES = 3 * 1024;

const gzipBytes = s => gzipSync(Buffer.from(s), { level: 9 }).length;

/** {raw, minified, gzipped, min_gzipped, minifier} byte sizes of one source text. */
export async function measure(source) {
  const require = createRequire(PROBE_DIR);
  const terser = require('terser');
  const version = require('terser/package.json').version;
  const out = await terser.minify(source, { compress: { passes: 2 }, mangle: true, ecma: 2020 });
  return {
    raw: Buffer.byteLength(source),
    gzipped: gzipBytes(source),
    minified: Buffer.byteLength(out.code),
    min_gzipped: gzipBytes(out.code),
    minifier: `terser ${version} (compress passes=2, mangle)`,
  };
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  let classic;
  for (const file of ['probe.global.js', 'probe.js']) {
    const s = await measure(readFileSync(new URL(file, PROBE_DIR), 'utf8'));
    console.log(`${file}: raw ${s.raw} B, gzip ${s.gzipped} B, minified ${s.minified} B, min+gzip ${s.min_gzipped} B`);
    classic ??= s;
  }
  console.log(`minifier: ${classic.minifier}; gzip: node:zlib level 9`);
  console.log(`budget (classic build, min+gzip): ${BUDGET_MIN_GZIP_BYTES} B -> ${classic.min_gzipped <= BUDGET_MIN_GZIP_BYTES ? 'ok' : 'OVER'}`);
  process.exitCode = classic.min_gzipped <= BUDGET_MIN_GZIP_BYTES ? 0 : 1;
}
