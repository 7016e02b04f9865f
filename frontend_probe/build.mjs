// Generates, from the ES module probe.js (the only hand-written source):
//   probe.global.js       the classic-<script> build exposing window.TTFTProbe (readable)
//   probe.min.js          probe.js minified (ES module, same exports)
//   probe.global.min.js   probe.global.js minified: what the tracer serves at /probe/probe.global.js
// The minifier is terser, pinned exactly in package.json (`npm ci` first); the same version and
// options always give the same bytes, so a test can check the committed files are fresh.
//   node build.mjs          # rewrites all three
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const HERE = new URL('.', import.meta.url);
export const OUTPUTS = ['probe.global.js', 'probe.min.js', 'probe.global.min.js'];
// ecma 2020: the output may use syntax up to ES2020 (every evergreen browser runs it);
// passes=2 finds a few more inlinings than one.
const TERSER = { compress: { passes: 2 }, mangle: true, ecma: 2020 };
const BANNER = '/*! @ttftscope/probe 0.1.0 (minified by build.mjs from probe.js) */\n';

/** The classic build of `src`: exports become locals, TTFTProbe becomes a global. */
export function buildClassic(src) {
  const body = src.replace(/^export (?=(function|const|class) )/gm, '');
  // anything else (export default, export {...}) would silently vanish: refuse instead
  if (/^\s*export\b/m.test(body)) throw new Error('probe.js: unsupported export form');
  return (
    '/* Generated from probe.js by build.mjs: do not edit. */\n' +
    "(function () {\n'use strict';\n" + body + '\nglobalThis.TTFTProbe = TTFTProbe;\n})();\n'
  );
}

/** `source` minified by the pinned terser; `module` keeps exports and mangles top level. */
export async function minify(source, { module = false } = {}) {
  const terser = createRequire(HERE)('terser');
  // a fresh copy each time: terser writes into the options it is given (module, ecma...)
  const out = await terser.minify(source, { ...structuredClone(TERSER), module });
  return BANNER + out.code + '\n';
}

/** {file name: contents} of every generated file, from the module source `src`. */
export async function buildAll(src) {
  const classic = buildClassic(src);
  return {
    'probe.global.js': classic,
    'probe.min.js': await minify(src, { module: true }),
    'probe.global.min.js': await minify(classic),
  };
}

export function readSources() {
  const read = f => readFileSync(new URL(f, HERE), 'utf8');
  return {
    module: read('probe.js'),
    classic: read('probe.global.js'),
    moduleMin: read('probe.min.js'),
    classicMin: read('probe.global.min.js'),
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const built = await buildAll(readFileSync(new URL('probe.js', HERE), 'utf8'));
  for (const [name, text] of Object.entries(built)) writeFileSync(new URL(name, HERE), text);
  console.log(`wrote ${OUTPUTS.join(', ')}`);
}
