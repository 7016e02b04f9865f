// Drives a real headless Chromium through the /demo chat page and screenshots /ui.
//   node tests/integration/browser_driver.mjs '{"baseUrl": "http://127.0.0.1:8000",
//        "outDir": "/tmp/out", "prompt": "Hi", "maxTokens": 8, "timeoutMs": 120000}'
// Prints one JSON line: {traceId, answer, clientJoined, pageErrors, waterfallLabels, engineInfo,
//   verdict, diagnosisCauses,
// screenshots}.
import { join } from 'node:path';

import { openBrowser, waitForJoin, runMain } from '../../tools/headless_chromium.mjs';

async function chat(page, opts) {
  await page.goto(`${opts.baseUrl}/demo`);
  await page.waitForFunction(() => /^model: /.test(document.getElementById('model').textContent));
  await page.fill('#max-tokens', String(opts.maxTokens));
  await page.fill('#prompt', opts.prompt);
  await page.click('#send');
  const done = await page.waitForSelector('li.msg.assistant[data-state="done"], li.msg.error',
    { timeout: opts.timeoutMs });
  if ((await done.getAttribute('data-state')) !== 'done') {
    throw new Error(`chat failed: ${await done.textContent()}`);
  }
  return { traceId: await done.getAttribute('data-trace-id'),
           answer: await done.evaluate(li => li.firstChild.textContent) };
}

async function main() {
  const opts = { maxTokens: 8, timeoutMs: 120000, ...JSON.parse(process.argv[2]) };
  const deadline = Date.now() + opts.timeoutMs;
  const { page, pageErrors, close } = await openBrowser(opts.executablePath, {
    viewport: { width: 1280, height: 900 } });
  try {
    const { traceId, answer } = await chat(page, opts);
    await page.screenshot({ path: join(opts.outDir, 'demo.png') });
    const clientJoined = await waitForJoin(opts.baseUrl, traceId, deadline);
    await page.goto(`${opts.baseUrl}/ui/#trace=${traceId}`);
    await page.waitForSelector(`body[data-waterfall="${traceId}"][data-waterfall-client="yes"]`,
      { timeout: Math.max(deadline - Date.now(), 1000) });
    const shots = { ui: join(opts.outDir, 'ui.png'), waterfall: join(opts.outDir, 'waterfall.png') };
    await page.screenshot({ path: shots.ui, fullPage: true });
    await page.locator('#waterfall-panel').screenshot({ path: shots.waterfall });
    const waterfallLabels = await page.$$eval('#waterfall svg text', ts => ts.map(t => t.textContent));
    // Our engine names its CPU path in /v1/models and /ui shows it; another upstream does not.
    if (opts.expectEngineInfo) {
      await page.waitForFunction(() => document.getElementById('engine-info').textContent !== '',
        null, { timeout: Math.max(deadline - Date.now(), 1000) });
    }
    const engineInfo = await page.$eval('#engine-info', e => e.textContent);
    // The verdict's sentence above the waterfall, and the window's causes as the page ranks them.
    const verdict = await page.$eval('#verdict', e => ({ text: e.textContent, cause: e.dataset.cause }));
    await page.waitForSelector('#diagnosis tbody tr[data-cause]',
      { timeout: Math.max(deadline - Date.now(), 1000) });
    const diagnosisCauses = await page.$$eval('#diagnosis tbody tr', rs => rs.map(r => r.dataset.cause));
    console.log(JSON.stringify({ traceId, answer, clientJoined, pageErrors, waterfallLabels, engineInfo,
      verdict, diagnosisCauses,
      screenshots: { ...shots, demo: join(opts.outDir, 'demo.png') } }));
  } finally {
    await close();
  }
}

runMain(main);
