// Headless Chromium for the scripts that drive /demo and /ui: tools/screenshot_ui.mjs and the
// browser tests' drivers (tests/integration/*_driver.mjs). playwright-core is a devDependency
// of frontend_probe/ (`cd frontend_probe && npm ci`; `make test` installs it), resolved from
// this checkout; NODE_PATH, when set, is where Node looks next.
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const require = createRequire(new URL('../frontend_probe/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
  '--no-first-run', '--disable-background-networking', '--disable-component-update',
  '--disable-sync'];

// A fresh profile and its first page, with the page's errors and console errors collected;
// `close()` ends the browser and removes the profile. `contextOptions` go to playwright's
// launchPersistentContext (viewport, deviceScaleFactor, ...).
export async function openBrowser(executablePath, contextOptions = {}) {
  const profile = mkdtempSync(join(tmpdir(), 'ttftscope-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: executablePath || '/usr/bin/chromium', headless: true,
    args: CHROMIUM_ARGS, ...contextOptions });
  const page = context.pages()[0] || (await context.newPage());
  const pageErrors = [];
  page.on('pageerror', err => pageErrors.push(String(err)));
  page.on('console', msg => { if (msg.type() === 'error') pageErrors.push(msg.text()); });
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, page, pageErrors, close };
}

// Whether the server joined the probe's beacon to `traceId` before `deadline` (the beacon
// leaves after the stream ends and the first paint): polls the server's view.
export async function waitForJoin(baseUrl, traceId, deadline) {
  while (Date.now() < deadline) {
    const res = await fetch(`${baseUrl}/ui/api/trace/${traceId}`);
    if (res.ok && (await res.json()).client) return true;
    await new Promise(r => setTimeout(r, 100));
  }
  return false;
}

// Runs a script's async main: an error is printed with its stack and exits 1.
export function runMain(main) {
  main().catch(err => {
    console.error(err && err.stack ? err.stack : String(err));
    process.exit(1);
  });
}
