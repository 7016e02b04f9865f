// Headless Chromium on /ui of a server with an API key: the page must ask for the key, keep
// it in sessionStorage (never in the URL), and then show the requests.
//   node tests/reliability/ui_key_driver.mjs '{"baseUrl": "...", "key": "...", "traceId": "..."}'
// Prints one JSON line: {askedForKey, rowsBefore, rowShown, storedKey, url, pageErrors}.
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const require = createRequire(new URL('../../frontend_probe/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const opts = JSON.parse(process.argv[2]);
const profile = mkdtempSync(join(tmpdir(), 'ttftscope-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
const pageErrors = [];
try {
  const page = context.pages()[0] || (await context.newPage());
  page.on('pageerror', err => pageErrors.push(String(err)));
  await page.goto(`${opts.baseUrl}/ui/`);
  await page.waitForSelector('#key-form:not([hidden])', { timeout: 30000 });
  const rowsBefore = await page.locator('#requests tbody tr').count();
  await page.fill('#key-input', opts.key);
  await page.click('#key-form button[type="submit"]');
  await page.waitForSelector(`#requests tbody tr[data-trace-id="${opts.traceId}"]`, { timeout: 30000 });
  const storedKey = await page.evaluate(() => sessionStorage.getItem('ttftscope.apiKey'));
  const formHidden = await page.locator('#key-form').evaluate(f => f.hidden);
  console.log(JSON.stringify({ askedForKey: true, rowsBefore, rowShown: true, storedKey,
    formHidden, url: page.url(), pageErrors }));
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
