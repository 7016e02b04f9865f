// Generates probe.global.js, the classic-<script> build exposing window.TTFTProbe, from the
// ES module probe.js. Zero dependencies: it only strips `export` and wraps an IIFE.
//   node build.mjs          # rewrites probe.global.js
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const HERE = new URL('.', import.meta.url);

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

export function readSources() {
  return {
    module: readFileSync(new URL('probe.js', HERE), 'utf8'),
    classic: readFileSync(new URL('probe.global.js', HERE), 'utf8'),
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const src = readFileSync(new URL('probe.js', HERE), 'utf8');
  writeFileSync(new URL('probe.global.js', HERE), buildClassic(src));
  console.log('wrote probe.global.js');
}
