// The browser half of tools/screenshot_ui.py: real requests into a running engine, then a
// screenshot of /ui on one of them, in headless Chromium (tools/headless_chromium.mjs).
//   node tools/screenshot_ui.mjs '{"baseUrl": "http://127.0.0.1:8000", "model": "…",
//        "out": "docs/img/ui.png", "width": 1280, "height": 960, "timeoutMs": 240000}'
// One long prompt (fetched from here), then, while it prefills, a short one typed into /demo
// (so the probe's beacon joins the browser's view to it) and another short one fetched:
// the short one's waterfall, verdict and neighbours then have something to show.
// Prints one JSON line: {traceId, longTraceId, clientJoined, verdict, neighbours, pageErrors}.

import { openBrowser, waitForJoin, runMain } from './headless_chromium.mjs';

// ~2,000 tokens: long enough that the short requests arrive during its prefill.
const LONG_PROMPT = 'Summarise this list: ' + Array.from({ length: 500 }, (_, i) => `item${i}`).join(' ');
const SHORT_PROMPT = 'Say hi.';

// The trace id the server put in Server-Timing (`traceparent;desc="00-<trace>-<span>-01"`).
function traceIdOf(res) {
  const m = /00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}/.exec(res.headers.get('server-timing') || '');
  if (!m) throw new Error(`no traceparent in Server-Timing: ${res.headers.get('server-timing')}`);
  return m[1];
}

async function chatFetch(opts, content, maxTokens) {
  const res = await fetch(`${opts.baseUrl}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: opts.model, messages: [{ role: 'user', content }],
                           stream: true, max_tokens: maxTokens, temperature: 0 }) });
  const body = await res.text();             // the whole stream: the request has finished
  if (res.status !== 200) throw new Error(`chat ${res.status}: ${body.slice(0, 300)}`);
  return traceIdOf(res);
}

async function chatInPage(page, opts) {
  await page.fill('#max-tokens', '16');
  await page.fill('#prompt', SHORT_PROMPT);
  await page.click('#send');
  const done = await page.waitForSelector('li.msg.assistant[data-state="done"], li.msg.error',
    { timeout: opts.timeoutMs });
  if ((await done.getAttribute('data-state')) !== 'done') {
    throw new Error(`chat failed: ${await done.textContent()}`);
  }
  return done.getAttribute('data-trace-id');
}

async function main() {
  const opts = { width: 1280, height: 960, timeoutMs: 240000, ...JSON.parse(process.argv[2]) };
  const deadline = Date.now() + opts.timeoutMs;
  const left = () => Math.max(deadline - Date.now(), 1000);
  const { page, pageErrors, close } = await openBrowser(opts.executablePath, {
    viewport: { width: opts.width, height: opts.height },
    deviceScaleFactor: 1 });
  try {
    await page.goto(`${opts.baseUrl}/demo`);
    await page.waitForFunction(() => /^model: /.test(document.getElementById('model').textContent));

    const long = chatFetch(opts, LONG_PROMPT, 16);
    await new Promise(r => setTimeout(r, 150));  // the long prompt is in its prefill
    const other = chatFetch(opts, 'Count to five.', 16);
    const traceId = await chatInPage(page, opts);
    const [longTraceId] = await Promise.all([long, other]);
    const clientJoined = await waitForJoin(opts.baseUrl, traceId, deadline);

    await page.goto(`${opts.baseUrl}/ui/#trace=${traceId}`);
    // Everything the page draws for the request: waterfall (with the browser's stages),
    // verdict, timeline around it, neighbours, and the window's causes.
    await page.waitForSelector(`body[data-waterfall="${traceId}"]`
      + (clientJoined ? '[data-waterfall-client="yes"]' : ''), { timeout: left() });
    await page.waitForSelector('#verdict[data-cause]:not([data-cause=""])',
      { state: 'attached', timeout: left() });
    await page.waitForSelector(`#timeline[data-state="drawn"][data-trace-id="${traceId}"]`,
      { state: 'attached', timeout: left() });
    await page.waitForSelector(`#neighbours[data-trace-id="${traceId}"]`,
      { state: 'attached', timeout: left() });
    await page.waitForSelector('#diagnosis tbody tr[data-cause]', { timeout: left() });
    await page.waitForFunction(() => document.getElementById('engine-info').textContent !== '',
      null, { timeout: left() });
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: opts.out });   // the viewport: width x height exactly
    const verdict = await page.$eval('#verdict', e => ({ text: e.textContent, cause: e.dataset.cause }));
    const neighbours = await page.$$eval('#neighbours tbody tr', rs => rs.map(r => r.dataset.traceId || null));
    console.log(JSON.stringify({ traceId, longTraceId, clientJoined, verdict, neighbours, pageErrors }));
  } finally {
    await close();
  }
}

runMain(main);
