// Opens /ui in a real headless Chromium, waits for the timeline's canvas to be drawn, and
// reports what the page drew (the #timeline data- attributes timeline.js writes), the
// neighbours table, the verdict, the tooltip over the selected row, and screenshots.
//   node tests/integration/timeline_driver.mjs '{"url": "http://127.0.0.1:8000/ui/#trace=…",
//        "outDir": "/tmp/out", "traceId": "…", "range": {"fromUnixMs": A, "toUnixMs": B},
//        "clickRow": 3, "timeoutMs": 60000}'
// traceId (optional): wait until the timeline is drawn with that request selected.
// range (optional): then pick "from … to" in the form, fill it and submit, as a user would.
// clickRow (optional): then click that row of the canvas and wait for its waterfall.
// Prints one JSON line: {timeline, neighbours, neighboursFor, verdict, tooltip, clicked,
//   screenshots: {panel, canvas, pixels}, pageErrors}; pixels: the canvas's toDataURL().
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { openBrowser, runMain } from '../../tools/headless_chromium.mjs';

const drawn = (page, sel, timeout) => page.waitForSelector(`#timeline[data-state="drawn"]${sel}`,
  { state: 'attached', timeout });

async function main() {
  const opts = { timeoutMs: 60000, ...JSON.parse(process.argv[2]) };
  const { page, pageErrors, close } = await openBrowser(opts.executablePath, {
    viewport: { width: 1280, height: 1000 } });
  try {
    await page.goto(opts.url, { timeout: opts.timeoutMs });
    await drawn(page, opts.traceId ? `[data-trace-id="${opts.traceId}"]` : '', opts.timeoutMs);
    if (opts.traceId) {
      await page.waitForSelector(`#neighbours[data-trace-id="${opts.traceId}"]`,
        { state: 'attached', timeout: opts.timeoutMs });
    }
    if (opts.range) {
      const query = `from_unix_ms=${opts.range.fromUnixMs}&to_unix_ms=${opts.range.toUnixMs}`;
      await page.check('input[name="tl-mode"][value="range"]');
      // datetime-local holds local time to the ms: the page turns it back into unix ms
      const local = ms => new Date(ms - new Date(ms).getTimezoneOffset() * 60000).toISOString().slice(0, 23);
      await page.fill('#tl-from', local(opts.range.fromUnixMs));
      await page.fill('#tl-to', local(opts.range.toUnixMs));
      await page.click('#timeline-form button[type="submit"]');
      await drawn(page, `[data-query="${query}"]`, opts.timeoutMs);
    }
    const timeline = await page.$eval('#timeline', e => ({ ...e.dataset }));
    const neighbours = await page.$$eval('#neighbours tbody tr', rs => rs.map(r => ({
      traceId: r.dataset.traceId || null, cells: [...r.cells].map(c => c.textContent) })));
    const neighboursFor = await page.$eval('#neighbours', e => e.dataset.traceId || null);
    const verdict = await page.$eval('#verdict', e => ({ text: e.textContent, cause: e.dataset.cause }));
    const canvas = page.locator('#timeline-canvas');
    // a locator's screenshot scrolls it into view: the canvas's place is read before each use
    const at = async (x, y) => { const box = await canvas.boundingBox(); return [box.x + x, box.y + y]; };
    const rowY = i => Number(timeline.rowsTop) + i * Number(timeline.rowHeight) +
      Math.floor(Number(timeline.rowHeight) / 2);
    const shots = { panel: join(opts.outDir, 'timeline-panel.png'),
      canvas: join(opts.outDir, 'timeline-canvas.png'),
      pixels: join(opts.outDir, 'timeline-canvas-pixels.png') };
    await canvas.screenshot({ path: shots.canvas });
    // The canvas's own pixels as drawn (a screenshot's clip may start on a fractional pixel).
    const dataUrl = await page.$eval('#timeline-canvas', c => c.toDataURL('image/png'));
    writeFileSync(shots.pixels, Buffer.from(dataUrl.slice(dataUrl.indexOf(',') + 1), 'base64'));
    let tooltip = null;
    if (Number(timeline.selectedIndex) >= 0) {
      await page.mouse.move(...await at(120, rowY(Number(timeline.selectedIndex))));
      await page.waitForSelector('#timeline-tip:not([hidden])', { timeout: 5000 });
      tooltip = await page.$$eval('#timeline-tip div', ds => ds.map(d => d.textContent));
    }
    await page.locator('#timeline-panel').screenshot({ path: shots.panel });
    let clicked = null;
    if (opts.clickRow !== undefined) {
      const { requests } = await page.evaluate(q => fetch(`api/timeline?${q}`).then(r => r.json()),
        timeline.query);
      const want = requests[opts.clickRow].trace_id;
      await page.mouse.move(0, 0);
      await page.mouse.click(...await at(120, rowY(opts.clickRow)));
      await page.waitForSelector(`body[data-waterfall="${want}"]`,
        { state: 'attached', timeout: opts.timeoutMs });
      // around the selected request, the timeline is fetched again around the clicked one
      const after = `[data-trace-id="${want}"]` + (opts.range ? '' : `[data-query^="trace_id=${want}&"]`);
      await drawn(page, after, opts.timeoutMs);
      clicked = { traceId: want, waterfallId: await page.$eval('#waterfall-id', e => e.textContent),
        timeline: await page.$eval('#timeline', e => ({ ...e.dataset })) };
    }
    console.log(JSON.stringify({ timeline, neighbours, neighboursFor, verdict, tooltip, clicked,
      screenshots: shots, pageErrors }));
  } finally {
    await close();
  }
}

runMain(main);
