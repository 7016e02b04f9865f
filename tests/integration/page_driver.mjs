// Opens one test page (tests/integration/pages/) in a real headless Chromium and waits for
// its answer and its probe beacon.
//   node tests/integration/page_driver.mjs '{"url": "http://127.0.0.1:8080/page/chat.html?...",
//        "timeoutMs": 60000, "latencyMs": 1500}'
// latencyMs (optional): Chromium's own network emulation (DevTools' throttling, through a CDP
// session) adds that much latency to every request of the page, throughput unlimited.
// Prints one JSON line: {result: {text} | {error}, beacons: [{url, body}], pageErrors}.
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const require = createRequire(new URL('../../frontend_probe/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
  '--no-first-run', '--disable-background-networking', '--disable-component-update',
  '--disable-sync'];

async function main() {
  const opts = { timeoutMs: 60000, ...JSON.parse(process.argv[2]) };
  const profile = mkdtempSync(join(tmpdir(), 'ttftscope-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: opts.executablePath || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS });
  const pageErrors = [];
  try {
    const page = context.pages()[0] || (await context.newPage());
    page.on('pageerror', err => pageErrors.push(String(err)));
    page.on('console', msg => { if (msg.type() === 'error') pageErrors.push(msg.text()); });
    if (opts.latencyMs) {
      const cdp = await context.newCDPSession(page);
      await cdp.send('Network.enable');
      await cdp.send('Network.emulateNetworkConditions', {
        offline: false, latency: opts.latencyMs, downloadThroughput: -1, uploadThroughput: -1 });
    }
    await page.goto(opts.url, { timeout: opts.timeoutMs });
    await page.waitForFunction(() => window.__result, null, { timeout: opts.timeoutMs });
    const result = await page.evaluate(() => window.__result);
    if (!result.error) {
      // the beacon leaves after the stream ends and the first paint (at most 200 ms later)
      await page.waitForFunction(() => window.__beacons.length > 0, null, { timeout: opts.timeoutMs });
    }
    const beacons = await page.evaluate(() => window.__beacons);
    console.log(JSON.stringify({ result, beacons, pageErrors }));
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

main().catch(err => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
