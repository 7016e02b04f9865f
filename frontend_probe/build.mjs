// Generates, from the hand-written ES modules src/*.js (the probe) and formats.js (its add-on):
//   probe.js              the probe as one ES module: src/probe.js with what it imports inlined,
//                         dependencies first (what npm's `main` is, and what the tests import)
//   probe.global.js       the classic-<script> build exposing window.TTFTProbe (readable)
//   probe.min.js          probe.js minified (ES module, same exports)
//   probe.global.min.js   probe.global.js minified: what the tracer serves at /probe/probe.global.js
//   formats.global.js, formats.min.js, formats.global.min.js: the same for the stream-format
//                         add-on (its classic build adds its rules to window.TTFTProbe.rules)
// The minifier is terser, pinned exactly in package.json (`npm ci` first); the same version and
// options always give the same bytes, so a test can check the committed files are fresh.
// The inlining is this file's own, not a bundler's: it keeps every comment (probe.js and
// probe.global.js stay readable) and the code as written, so the minified bytes are what one
// hand-written file would give; it takes only the import and export forms src/ uses.
//   node build.mjs          # rewrites all of them
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { posix } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = new URL('.', import.meta.url);
export const OUTPUTS = ['probe.js', 'probe.global.js', 'probe.min.js', 'probe.global.min.js',
  'formats.global.js', 'formats.min.js', 'formats.global.min.js'];
// The add-on's one import, and what its classic build reads instead: the probe's global.
const ADDON_IMPORT = "import { RULES } from './probe.js';\n";
const ADDON_GLOBAL = 'const RULES = globalThis.TTFTProbe && globalThis.TTFTProbe.rules;\n' +
  "if (!RULES) throw new Error('formats.global.js: load probe.global.js first');\n";
// ecma 2020: the output may use syntax up to ES2020 (every evergreen browser runs it);
// passes=2 finds a few more inlinings than one.
const TERSER = { compress: { passes: 2 }, mangle: true, ecma: 2020 };
const banner = name => `/*! @ttftscope/probe 0.1.0 (minified by build.mjs from ${name}) */\n`;

const FROM = String.raw`\{([^}]*)\} from '(\.\.?\/[\w./]+\.js)';\n`;
const IMPORT = new RegExp(String.raw`^import ` + FROM, 'gm'), REEXPORT = new RegExp(String.raw`^export ` + FROM, 'gm');
const DECLARED = /^export (?:function|const|class) (\w+)/gm;

/**
 * The one-file ES module of `entry` and the modules it imports, each once, dependencies first;
 * `read(path)` gives a source by its path relative to this folder. An import's names must be
 * declared exports of the imported module; the entry's exports (declared or re-exported with
 * `export {...} from`) stay exported, the rest lose `export`. The entry's opening comment
 * opens the file.
 */
export function bundle(entry = 'src/probe.js', read = f => readFileSync(new URL(f, HERE), 'utf8')) {
  const modules = new Map(), pending = new Set(), exported = new Set();
  const names = (list, path) => list.split(',').map(n => n.trim()).filter(Boolean).map(n => {
    if (!/^\w+$/.test(n)) throw new Error(`${path}: unsupported import name ${n}`);
    return n;
  });
  function visit(path) {
    if (modules.has(path)) return modules.get(path);
    if (pending.has(path)) throw new Error(`${path}: import cycle`);
    pending.add(path);
    const uses = [], take = re => (_, list, spec) =>
      (uses.push([names(list, path), posix.join(posix.dirname(path), spec), re]), '');
    const body = read(path).replace(IMPORT, take(IMPORT)).replace(REEXPORT, take(REEXPORT));
    if (/^\s*import\b/m.test(body)) throw new Error(`${path}: unsupported import`);
    if (/^\s*export\b(?! (function|const|class) )/m.test(body)) throw new Error(`${path}: unsupported export form`);
    for (const [list, dep, re] of uses) {
      const { declares } = visit(dep);
      for (const n of list) {
        if (!declares.has(n)) throw new Error(`${path}: ${dep} does not export ${n}`);
        if (re === REEXPORT) exported.add(n);
      }
    }
    const module = { path, body, declares: new Set([...body.matchAll(DECLARED)].map(m => m[1])) };
    modules.set(path, module);
    return module;
  }
  const main = visit(entry);
  for (const n of main.declares) exported.add(n);
  const [, opening, rest] = /^((?:\/\/.*\n|\n)*)([^]*)$/.exec(main.body);
  const unexport = body => body.replace(DECLARED, (d, n) => exported.has(n) ? d : d.slice('export '.length));
  const part = ({ path, body }) => `// ---- ${path} ----\n` + unexport(body).replace(/\n{3,}/g, '\n\n').trim() + '\n';
  const dir = posix.dirname(entry);
  return `// Generated from ${dir}/ by build.mjs: do not edit (edit ${dir}/*.js, then \`npm run build\`).\n` +
    opening.trimEnd() + '\n\n' + [...modules.values()].map(m => part(m === main ? { ...m, body: rest } : m)).join('\n');
}

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

/** {file name: contents} of every generated file, from the one-file probe module and formats.js. */
export async function buildAll(src = bundle(), formats = readFileSync(new URL('formats.js', HERE), 'utf8')) {
  const classic = buildClassic(src), addon = buildClassicAddon(formats);
  return {
    'probe.js': src,
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
  const built = await buildAll();
  for (const [name, text] of Object.entries(built)) writeFileSync(new URL(name, HERE), text);
  console.log(`wrote ${OUTPUTS.join(', ')}`);
}
