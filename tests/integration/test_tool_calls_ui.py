"""/ui on an agent's turn, in real Chromium (issue 37, item 5): the proxy relays a recorded
two-call tool stream (tests/fixtures/sse/formats/openai_tool_calls.sse) and the page says
when each call started and when its arguments were ready, by the function's name only, with
a waterfall row per call (docs/architecture.md, "First output, by kind")."""
from __future__ import annotations

import json
import subprocess

import httpx

from tests.proxy.proxy_support import start_proxy
from tests.proxy.test_proxy_formats import recording
from topology_support import REPO, require_browser_stack
from tracer.testing.fake_upstream import MODEL, FakeUpstream

SCRIPT = """
import { openBrowser, runMain } from './tools/headless_chromium.mjs';
runMain(async () => {
  const [url] = process.argv.slice(1);
  const { page, pageErrors, close } = await openBrowser();
  try {
    await page.goto(url);
    await page.waitForFunction(() => document.getElementById('waterfall-facts')
      .textContent.includes('tool call'), null, { timeout: 30000 });
    const facts = await page.$$eval('#waterfall-facts .fact', els => els.map(e =>
      [e.querySelector('.label').textContent, e.querySelector('.value').textContent]));
    const labels = await page.$$eval('#waterfall svg text', els => els.map(e => e.textContent));
    console.log(JSON.stringify({ facts, labels, pageErrors }));
  } finally { await close(); }
});
"""


def test_ui_names_each_call_with_its_start_and_ready_times_and_no_arguments():
    node = require_browser_stack()
    upstream = FakeUpstream(recordings={"/v1/chat/completions":
                                        recording("openai_tool_calls.sse")}).start()
    live = start_proxy(upstream.base_url, (MODEL,))
    try:
        body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "?"}]}
        assert httpx.post(live.base_url + "/v1/chat/completions", json=body,
                          timeout=30).status_code == 200
        live.wait_idle()
        (record,) = live.parts.obs.store.recent(5)
        run = subprocess.run([node, "--input-type=module", "-e", SCRIPT,
                              f"{live.base_url}/ui#trace={record.trace_id}"],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
        assert run.returncode == 0, run.stderr[-3000:]
        page = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        live.app.stop()
        upstream.stop()
    assert page["pageErrors"] == []
    facts = dict(page["facts"])
    calls = [value for label, value in page["facts"] if label == "tool call"]
    assert facts["first output"].startswith("tool call at ")
    first, second = record.tool_calls
    assert calls[0].startswith("at ") and "(get_weather), arguments ready at " in calls[0]
    assert "(get_time), arguments ready at " in calls[1]
    assert first.ready_ns == second.start_ns
    # a waterfall row per call, by name; the arguments never reach the page
    assert {"get_weather", "get_time"} <= set(page["labels"])
    assert "Paris" not in run.stdout
