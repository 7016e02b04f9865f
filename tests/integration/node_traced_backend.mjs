// A Node chat backend traced the way a product's is (issue 32, item 5): the real
// @opentelemetry/sdk-node with the http instrumentation (a SERVER span per request, a CLIENT
// span per call to the engine, the browser's `traceparent` as parent, the engine call's
// injected) exporting OTLP/protobuf to the collector's /v1/traces, two manual spans of its
// own work before the engine call (`retrieve`, with `embed` nested in it, then `moderation`),
// the engine's SSE streamed back unchanged, and the beacon token signed by
// frontend_probe/server.js (docs/backends.md, "Signing the beacon in the backend").
// It also serves the test pages and the probe.
//   node tests/integration/node_traced_backend.mjs '{"port": 8081, "engine": "http://127.0.0.1:8000",
//        "collector": "http://127.0.0.1:4318", "beaconKey": "K", "spans": "/tmp/spans.jsonl"}'
// Every span it ends is also written, as it ends, to `spans` (one JSON line: name, kind, ids,
// start and end in Unix ns as strings): what the test compares the waterfall with.
import { appendFileSync, existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const PROBE_DIR = new URL('../../frontend_probe/', import.meta.url);
const PAGES = new URL('pages/', import.meta.url);
const require = createRequire(new URL('package.json', PROBE_DIR));
const { NodeSDK } = require('@opentelemetry/sdk-node');
const { HttpInstrumentation } = require('@opentelemetry/instrumentation-http');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { SimpleSpanProcessor } = require('@opentelemetry/sdk-trace');
const { context, propagation, trace, SpanStatusCode } = require('@opentelemetry/api');
const { signedServerTiming, exposeServerTiming } = await import(new URL('server.js', PROBE_DIR));

const opts = JSON.parse(process.argv[2] || '{}');
const WORK_MS = { retrieve_before: 12, embed: 25, retrieve_after: 6, moderation: 15, ...opts.workMs };
const JS = 'text/javascript; charset=utf-8';

const ns = ([s, n]) => (BigInt(s) * 1000000000n + BigInt(n)).toString();
// A SpanProcessor that writes each ended span: the same objects the OTLP exporter sends.
const dump = {
  onStart() {},
  onEnd(span) {
    const c = span.spanContext();
    appendFileSync(opts.spans, JSON.stringify({
      name: span.name, kind: span.kind, trace_id: c.traceId, span_id: c.spanId,
      parent_span_id: span.parentSpanContext ? span.parentSpanContext.spanId : null,
      start_ns: ns(span.startTime), end_ns: ns(span.endTime) }) + '\n');
  },
  forceFlush: async () => {},
  shutdown: async () => {},
};

const sdk = new NodeSDK({
  serviceName: 'node-chat-backend',
  spanProcessors: [new SimpleSpanProcessor({ exporter: new OTLPTraceExporter({ url: `${opts.collector}/v1/traces` }) }), dump],
  instrumentations: [new HttpInstrumentation({
    // the collector's own traffic (the exporter's POSTs) is not the product's
    ignoreOutgoingRequestHook: req => String(req.port) == new URL(opts.collector).port,
    ignoreIncomingRequestHook: req => !req.url.startsWith('/api/'),
  })],
});
sdk.start();
// After start(), so that the instrumentation patches the module (require-in-the-middle).
const http = require('node:http');
const tracer = trace.getTracer('node-chat-backend');

const sleep = ms => new Promise(r => setTimeout(r, ms));
// `fn` inside a span of its own, a child of the active one; ended when fn settles.
const inSpan = (name, fn) => tracer.startActiveSpan(name, async span => {
  try {
    return await fn();
  } catch (e) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: String(e) });
    throw e;
  } finally {
    span.end();
  }
});

async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return Buffer.concat(chunks);
}

// The engine call over node:http: the instrumentation's CLIENT span, its traceparent injected.
function callEngine(body) {
  return new Promise((resolve, reject) => {
    const req = http.request(`${opts.engine}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'content-length': body.length } },
    resolve);
    req.on('error', reject);
    req.end(body);
  });
}

async function chat(req, res) {
  // This request's own server span (the instrumentation's), for Server-Timing.
  const own = {};
  propagation.inject(context.active(), own);
  const body = await readBody(req);
  await inSpan('retrieve', async () => {
    await sleep(WORK_MS.retrieve_before);
    await inSpan('embed', () => sleep(WORK_MS.embed));
    await sleep(WORK_MS.retrieve_after);
  });
  await inSpan('moderation', () => sleep(WORK_MS.moderation));
  const upstream = await callEngine(body);
  const headers = new Headers({ 'content-type': upstream.headers['content-type'] || 'text/event-stream',
    'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  const signed = signedServerTiming(own.traceparent, opts.beaconKey);
  if (signed) headers.set('server-timing', signed);
  exposeServerTiming(headers);
  res.writeHead(upstream.statusCode, Object.fromEntries(headers));
  res.flushHeaders();
  for await (const chunk of upstream) res.write(chunk);
  res.end();
}

const STATIC = {
  '/probe/probe.global.js': [new URL('probe.global.js', PROBE_DIR), JS],
  '/page/harness.js': [new URL('harness.js', PAGES), JS],
  '/page/chat.html': [new URL('chat.html', PAGES), 'text/html; charset=utf-8'],
};

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, 'http://x');
    if (url.pathname == '/health') return void res.end('ok');
    if (req.method == 'POST' && url.pathname == '/api/chat/completions') return await chat(req, res);
    const file = STATIC[url.pathname];
    if (file && existsSync(file[0])) return void res.writeHead(200, { 'content-type': file[1] }).end(readFileSync(file[0]));
    res.writeHead(404).end();
  } catch (e) {
    console.error(e);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
server.listen(opts.port ?? 0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
const stop = () => server.close(() => sdk.shutdown().finally(() => process.exit(0)));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
