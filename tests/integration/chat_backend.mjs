// A product chat backend in Node, the way an AI SDK app is built: the real `ai` and
// `@ai-sdk/openai` (pinned in frontend_probe/package.json) call the engine through
// frontend_probe/server.js, and answer the page with the AI SDK's UI message stream or text
// stream. It also serves the test pages, the probe and its format add-on, one esbuild bundle
// of the browser clients (the AI SDK's AbstractChat and transports, @anthropic-ai/sdk,
// openai), and fake upstreams that replay the recorded streams of tests/fixtures/sse/formats/.
//   node tests/integration/chat_backend.mjs '{"port": 8081, "engine": "http://127.0.0.1:8000",
//        "model": "smollm2"}'
// Prints one line, `listening <port>`, once it serves.
import http from 'node:http';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const HERE = new URL('.', import.meta.url);
const PROBE_DIR = new URL('../../frontend_probe/', import.meta.url);
const FIXTURES = new URL('../fixtures/sse/formats/', import.meta.url);
const require = createRequire(new URL('package.json', PROBE_DIR));
const { streamText, convertToModelMessages } = await import(require.resolve('ai'));
const { createOpenAI } = await import(require.resolve('@ai-sdk/openai'));
const { build } = require('esbuild');
const { ttftJoin, writeTo } = await import(new URL('server.js', PROBE_DIR));

const opts = JSON.parse(process.argv[2] || '{}');
const EXPECTED = JSON.parse(readFileSync(new URL('expected.json', FIXTURES), 'utf8'));
// The gap between two reads of a replayed stream: far more than the 2 ms the page's own clock
// and the probe may differ by, so a first token taken at the wrong read cannot pass.
const GAP_MS = opts.gapMs ?? 60;
const JS = 'text/javascript; charset=utf-8';

// The browser clients, bundled once at start by the pinned esbuild (platform browser, ESM).
const bundle = (await build({
  stdin: {
    contents: "export { AbstractChat, DefaultChatTransport, TextStreamChatTransport } from 'ai';\n" +
      "export { default as Anthropic } from '@anthropic-ai/sdk';\nexport { default as OpenAI } from 'openai';\n",
    resolveDir: fileURLToPath(PROBE_DIR), loader: 'js',
  },
  bundle: true, minify: true, format: 'esm', platform: 'browser', write: false, logLevel: 'error',
})).outputFiles[0].text;

const STATIC = {
  '/probe/probe.global.js': [new URL('probe.global.min.js', PROBE_DIR), JS],
  '/probe/formats.global.js': [new URL('formats.global.min.js', PROBE_DIR), JS],
};

async function readJson(req) {
  let body = '';
  for await (const c of req) body += c;
  return JSON.parse(body || '{}');
}

// A Web Request view of the browser's request: what the helper reads its headers from.
const asRequest = req => ({ headers: req.headers });

async function chat(req, res, kind) {
  const { messages } = await readJson(req);
  const join = ttftJoin(asRequest(req));
  const engine = createOpenAI({ baseURL: `${opts.engine}/v1`, apiKey: 'unused', fetch: join.fetch });
  const result = streamText({ model: engine.chat(opts.model), messages: await convertToModelMessages(messages),
    maxOutputTokens: opts.maxTokens ?? 8, temperature: 0 });
  const response = kind == 'ui' ? result.toUIMessageStreamResponse() : result.toTextStreamResponse();
  await writeTo(res, await join.respond(response));
}

// Replays a recorded stream: its content type and headers, one read per recorded chunk.
async function replay(res, name) {
  const want = EXPECTED[name];
  const bytes = readFileSync(new URL(name, FIXTURES));
  const cutsFile = new URL(name.replace(/\.\w+$/, '.chunks.json'), FIXTURES);
  const cuts = existsSync(cutsFile) ? JSON.parse(readFileSync(cutsFile, 'utf8')) : [];
  const bounds = [0, ...cuts, bytes.length];
  res.writeHead(200, { 'content-type': want.content_type, 'cache-control': 'no-cache', ...want.headers });
  res.flushHeaders();
  for (let i = 1; i < bounds.length; i++) {
    if (i > 1) await new Promise(r => setTimeout(r, GAP_MS));
    res.write(bytes.subarray(bounds[i - 1], bounds[i]));
  }
  res.end();
}

// /fake/<fixture>/<anything the client appends>: the client's own path is ignored.
const FAKE = /^\/fake\/([\w.]+)\//;

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, 'http://x');
    const fake = FAKE.exec(url.pathname);
    if (url.pathname == '/health') return void res.end('ok');
    if (req.method == 'POST' && url.pathname == '/v1/probe') {
      req.resume();
      return void res.writeHead(204).end();
    }
    if (req.method == 'POST' && url.pathname == '/api/chat') return await chat(req, res, 'ui');
    if (req.method == 'POST' && url.pathname == '/api/text') return await chat(req, res, 'text');
    if (req.method == 'POST' && fake && EXPECTED[fake[1]]) {
      req.resume();
      return await replay(res, fake[1]);
    }
    if (url.pathname == '/vendor/clients.js') return void res.writeHead(200, { 'content-type': JS }).end(bundle);
    const page = /^\/page\/([\w.-]+\.(html|js))$/.exec(url.pathname);
    const file = page ? [new URL(`pages/${page[1]}`, HERE), page[2] == 'js' ? JS : 'text/html; charset=utf-8']
      : STATIC[url.pathname];
    if (file && existsSync(file[0])) return void res.writeHead(200, { 'content-type': file[1] }).end(readFileSync(file[0]));
    res.writeHead(404).end();
  } catch (e) {
    console.error(e);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
server.listen(opts.port ?? 0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
