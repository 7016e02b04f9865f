"""/ui in real Chromium over a store that outlived the process that wrote it: the requests
of an earlier run are listed, the slowest first when asked, and their waterfall draws."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from fastapi import FastAPI

from store_support import finish_request, serving
from tracer.web.observability import ObservabilitySettings, build_observability

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from topology_support import require_browser_stack  # noqa: E402

SCRIPT = """
import { openBrowser, runMain } from './tools/headless_chromium.mjs';
runMain(async () => {
  const [url, slowest] = process.argv.slice(1);
  const { page, pageErrors, close } = await openBrowser();
  try {
    await page.goto(url);
    await page.waitForSelector('#requests tbody tr');
    const newest = await page.$$eval('#requests tbody tr', rows => rows.map(r => r.dataset.traceId));
    await page.selectOption('#requests-order', 'slowest');
    await page.selectOption('#requests-window', '60');
    await page.waitForFunction(s => document.querySelector('#requests tbody tr')
      && document.querySelector('#requests tbody tr').dataset.traceId === s, slowest,
      { timeout: 30000 });
    await page.click('#requests tbody tr');
    await page.waitForFunction(s => document.body.dataset.waterfall === s, slowest,
      { timeout: 30000 });
    const bars = await page.$$eval('#waterfall svg text', els => els.map(e => e.textContent));
    const verdict = await page.$eval('#verdict', e => e.textContent);
    console.log(JSON.stringify({ newest, bars, verdict, pageErrors }));
  } finally { await close(); }
});
"""


def test_an_earlier_runs_requests_are_listed_ranked_and_drawn(tmp_path):
    node = require_browser_stack()
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    earlier = build_observability(ObservabilitySettings(store=url), model_names=("m",))
    ttfts = [25.0, 180.0, 40.0, 30.0]
    base_ns = time.perf_counter_ns() - 10**9     # started 100 ms apart, a second ago
    traces = [finish_request(earlier, i, ttft_ms=t, start_ns=base_ns + i * 100_000_000)
              for i, t in enumerate(ttfts)]
    assert earlier.close()
    now = build_observability(ObservabilitySettings(store=url), model_names=("m",))
    assert len(now.store.ring) == 0        # every row below comes from the file
    app = FastAPI()
    now.include_routes(app)
    # What the page asks a front besides /ui (its engine line): a front with no engine.
    app.add_api_route("/v1/models", lambda: {"object": "list", "data": []})
    try:
        with serving(app) as base:
            run = subprocess.run([node, "--input-type=module", "-e", SCRIPT, f"{base}/ui",
                                  traces[1]], capture_output=True, text=True, timeout=120,
                                 cwd=REPO)
    finally:
        now.close()
    assert run.returncode == 0, run.stderr[-3000:]
    page = json.loads(run.stdout.strip().splitlines()[-1])
    assert page["pageErrors"] == []
    assert page["newest"] == traces[::-1]
    assert "prefill" in page["bars"] and "send" in page["bars"]
    assert page["verdict"]
