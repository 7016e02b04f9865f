// Generates, from the ES modules probe.js and formats.js (the only hand-written sources):
//   probe.global.js       the classic-<script> build exposing window.TTFTProbe (readable)
//   probe.min.js          probe.js minified (ES module, same exports)
//   probe.global.min.js   probe.global.js minified: what the tracer serves at /probe/probe.global.js
//   formats.global.js, formats.min.js, formats.global.min.js: the same for the stream-format
//                         add-on (its classic build adds its rules to window.TTFTProbe.rules)
// The minifier is terser, pinned exactly in package.json (`npm ci` first); the same version and
// options always give the same bytes, so a test can check the committed files are fresh.
//   node build.mjs          # rewrites all three
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const HERE = new URL('.', import.meta.url);
export const OUTPUTS = ['probe.global.js', 'probe.min.js', 'probe.global.min.js',
  'formats.global.js', 'formats.min.js', 'formats.global.min.js'];
// The add-on's one import, and what its classic build reads instead: the probe's global.
const ADDON_IMPORT = "import { RULES } from './probe.js';\n";
const ADDON_GLOBAL = 'const RULES = globalThis.TTFTProbe && globalThis.TTFTProbe.rules;\n' +
  "if (!RULES) throw new Error('formats.global.js: load probe.global.js first');\n";
// ecma 2020: the output may use syntax up to ES2020 (every evergreen browser runs it);
// passes=2 finds a few more inlinings than one.
const TERSER = { compress: { passes: 2 }, mangle: true, ecma: 2020 };
const banner = name => `/*! @ttftscope/probe 0.1.0 (minified by build.mjs from ${name}) */\n`;

/** The classic build of `src`: exports become locals, TTFTProbe becomes a global. */
export function buildClassic(src, { name = 'probe.js', tail = '\nglobalThis.TTFTProbe = TTFTProbe;\n' } = {}) {
  const body = src.replace(/^export (?=(function|const|class) )/gm, '');
  // anything else (export default, export {...}, an import) would silently break: refuse
  if (/^\s*export\b/m.test(body)) throw new Error(`${name}: unsupported export form`);
  if (/^\s*import\b/m.test(body)) throw new Error(`${name}: unsupported import`);
  return (
    `/* Generated from ${name} by build.mjs: do not edit. */\n` +
    "(function () {\n'use strict';\n" + body + tail + '})();\n'
  );
}

/** The classic build of the add-on formats.js: it reads the probe's global instead of importing. */
export function buildClassicAddon(src) {
  if (!src.includes(ADDON_IMPORT)) throw new Error('formats.js: expected ' + ADDON_IMPORT.trim());
  return buildClassic(src.replace(ADDON_IMPORT, ADDON_GLOBAL), { name: 'formats.js', tail: '' });
}

/** `source` minified by the pinned terser; `module` keeps exports and mangles top level. */
export async function minify(source, { module = false, name = 'probe.js' } = {}) {
  const terser = createRequire(HERE)('terser');
  // a fresh copy each time: terser writes into the options it is given (module, ecma...)
  const out = await terser.minify(source, { ...structuredClone(TERSER), module });
  return banner(name) + out.code + '\n';
}

/** {file name: contents} of every generated file, from the module sources. */
export async function buildAll(src, formats = readFileSync(new URL('formats.js', HERE), 'utf8')) {
  const classic = buildClassic(src), addon = buildClassicAddon(formats);
  return {
    'probe.global.js': classic,
    'probe.min.js': await minify(src, { module: true }),
    'probe.global.min.js': await minify(classic),
    'formats.global.js': addon,
    'formats.min.js': await minify(formats, { module: true, name: 'formats.js' }),
    'formats.global.min.js': await minify(addon, { name: 'formats.js' }),
  };
}

export function readSources() {
  const read = f => readFileSync(new URL(f, HERE), 'utf8');
  return {
    module: read('probe.js'),
    classic: read('probe.global.js'),
    moduleMin: read('probe.min.js'),
    classicMin: read('probe.global.min.js'),
    formats: read('formats.js'),
    formatsClassic: read('formats.global.js'),
    formatsModuleMin: read('formats.min.js'),
    formatsClassicMin: read('formats.global.min.js'),
  };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const built = await buildAll(readFileSync(new URL('probe.js', HERE), 'utf8'));
  for (const [name, text] of Object.entries(built)) writeFileSync(new URL(name, HERE), text);
  console.log(`wrote ${OUTPUTS.join(', ')}`);
}
