// Opens one test page (tests/integration/pages/) in a real headless Chromium and waits for
// its answer and its probe beacon.
//   node tests/integration/page_driver.mjs '{"url": "http://127.0.0.1:8080/page/chat.html?...",
//        "timeoutMs": 60000, "latencyMs": 1500}'
// latencyMs (optional): Chromium's own network emulation (DevTools' throttling, through a CDP
// session) adds that much latency to every request of the page, throughput unlimited.
// Prints one JSON line: {result: {text} | {error}, beacons: [{url, body}], pageErrors}.

import { openBrowser, runMain } from '../../tools/headless_chromium.mjs';

async function main() {
  const opts = { timeoutMs: 60000, ...JSON.parse(process.argv[2]) };
  const { context, page, pageErrors, close } = await openBrowser(opts.executablePath);
  try {
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
    await close();
  }
}

runMain(main);
