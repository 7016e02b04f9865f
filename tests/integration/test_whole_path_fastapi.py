"""Issue 32, the whole path with no ttftscope component in the data path: real Chromium with
the probe → a FastAPI backend traced by the real OpenTelemetry instrumentations (fastapi,
httpx, DB-API on sqlite3; tests/integration/traced_backend_app.py) → an engine stand-in that
exports vLLM's request span with the real SDK (vllm_standin_app.py). Both export to
`python -m tracer collect`, which also gets the beacon and alone builds the waterfall:
network, the backend's critical path by span name, backend → engine, the engine's queue,
prefill and other, and the client's first token, summing to client TTFT.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys

import httpx
import pytest

from prom_support import free_port, wait_for
from topology_support import (
    REPO,
    collector,
    metric_samples,
    open_page,
    process,
    require_browser_stack,
)

# The collector's /ui on the trace: the waterfall's row labels, in order.
UI_SCRIPT = """
import { openBrowser, runMain } from './tools/headless_chromium.mjs';
runMain(async () => {
  const [url] = process.argv.slice(1);
  const { page, pageErrors, close } = await openBrowser();
  try {
    await page.goto(url);
    await page.waitForFunction(() => document.querySelectorAll('#waterfall svg text').length > 8,
                               null, { timeout: 30000 });
    const labels = await page.$$eval('#waterfall svg text', els => els.map(e => e.textContent));
    const facts = await page.$$eval('#waterfall-facts .fact', els => els.map(e =>
      [e.querySelector('.label').textContent, e.querySelector('.value').textContent]));
    console.log(JSON.stringify({ labels, facts, pageErrors }));
  } finally { await close(); }
});
"""
STANDIN = "tests.integration.vllm_standin_app"
BACKEND = "tests.integration.traced_backend_app"


def _uvicorn(module: str, env: dict, log):
    port = free_port()
    return process([sys.executable, "-m", "uvicorn", f"{module}:app", "--host", "127.0.0.1",
                    "--port", str(port), "--log-level", "warning"], port=port,
                   health="/health", env=env, log=log)


@pytest.fixture(scope="module")
def path_topology(tmp_path_factory):
    node = require_browser_stack()
    key = secrets.token_hex(16)
    logs = tmp_path_factory.mktemp("whole_path")
    dump = logs / "backend_spans.jsonl"
    backend_port = free_port()
    origin = f"http://127.0.0.1:{backend_port}"
    with collector(key, logs / "collector.log", "--join-wait-s", "5", "--cors-origin", origin,
                   "--served-model-name", "standin-model", "--path-segment", "auth") as coll, \
            _uvicorn(STANDIN, {"TTFT_COLLECTOR_URL": coll}, logs / "standin.log") as standin:
        env = {"TTFT_ENGINE_URL": standin, "TTFT_COLLECTOR_URL": coll, "TTFT_BEACON_KEY": key,
               "TTFT_SPAN_DUMP": str(dump)}
        with process([sys.executable, "-m", "uvicorn", f"{BACKEND}:app", "--host", "127.0.0.1",
                      "--port", str(backend_port), "--log-level", "warning"], port=backend_port,
                     health="/health", env=env, log=logs / "backend.log") as web:
            yield node, web, coll, dump


def _spans(dump, trace_id: str) -> dict[str, dict]:
    out = {}
    for line in dump.read_text().splitlines():
        span = json.loads(line)
        if span["context"]["trace_id"] == "0x" + trace_id:
            out.setdefault(span["name"], span)
    return out


def _ms(span: dict) -> float:
    from datetime import datetime
    start = datetime.fromisoformat(span["start_time"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(span["end_time"].replace("Z", "+00:00"))
    return (end - start).total_seconds() * 1e3


def test_the_collector_builds_the_whole_path_from_the_backends_own_spans(path_topology):
    from tests.integration.vllm_standin_app import OTHER_S, PREFILL_S, QUEUE_S
    node, web, coll, dump = path_topology
    out = open_page(node, f"{web}/page/chat.html?api=/api/v1&model=standin-model"
                          f"&collector={coll}/v1/probe")
    assert out["result"]["text"] == "Paris is the capital.", out
    [sent] = out["beacons"]
    beacon = json.loads(sent["body"])
    assert beacon["outcome"] == "ok" and "server" not in beacon and beacon["token"]
    trace_id = beacon["trace_id"]

    def assembled():
        r = httpx.get(f"{coll}/ui/api/trace/{trace_id}", timeout=5)
        return r.json() if r.status_code == 200 else None
    view = wait_for(assembled, 30, "the collector's whole-path record")
    stages = view["stages"]
    names = [(s["attrs"]["part"], s["stage"]) for s in stages]
    # Contiguous, and summing to client TTFT.
    for a, b in zip(stages, stages[1:]):
        assert b["start_ms"] == pytest.approx(a["end_ms"], abs=1e-6), names
    client_ttft = view["client"]["client_ttft_ms"]
    assert client_ttft == beacon["t"]["first_token"]
    assert sum(s["duration_ms"] for s in stages) == pytest.approx(client_ttft, abs=0.01)
    assert stages[0]["stage"] == "network" and stages[-1]["stage"] == "first_token", (
        [(s["stage"], s["duration_ms"]) for s in stages], view["client"].get("clock"))

    # The backend's critical path, named by its spans, each equal to its span within 1 ms.
    spans = _spans(dump, trace_id)
    backend = {}
    for s in stages:
        if s["attrs"]["part"] == "backend":
            backend[s["stage"]] = backend.get(s["stage"], 0.0) + s["duration_ms"]
    db_span = next(name for name in spans if name.startswith("SELECT"))
    assert {"auth", "retrieve", db_span, "rerank"} <= set(backend), names
    assert "moderation" not in backend, names       # concurrent and shorter: off the path
    for leaf in ("auth", db_span, "rerank"):
        assert backend[leaf] == pytest.approx(_ms(spans[leaf]), abs=1.0), (leaf, names)
    assert backend["retrieve"] + backend[db_span] + backend["rerank"] == pytest.approx(
        _ms(spans["retrieve"]), abs=1.0)

    # The engine's part: vLLM's own numbers, placed between the call and the first token.
    engine = {s["stage"]: s["duration_ms"] for s in stages if s["attrs"]["part"] == "engine"}
    assert engine["queue"] == pytest.approx(QUEUE_S * 1e3, abs=0.01)
    assert engine["prefill"] == pytest.approx(PREFILL_S * 1e3, abs=0.01)
    assert engine["engine_other"] >= OTHER_S * 1e3 - 0.01   # measured: the rest of its TTFT
    assert [n for _, n in names if n in ("backend_to_engine", "queue")] == \
        ["backend_to_engine", "queue"]

    # The metrics: one observation per segment label, the learned and configured ones.
    samples = metric_samples(coll)
    key = 'llm_path_segment_seconds_count{model="standin-model",part="%s",segment="%s"}'
    assert samples[key % ("backend", "auth")] == 1
    assert samples[key % ("engine", "queue")] == 1
    assert samples[key % ("network", "first_token")] == 1
    assert samples['llm_collector_traces_total{outcome="complete"}'] == 1
    assert samples["llm_client_time_to_first_token_seconds_count"] == 1

    # /ui draws it: the groups, the backend's spans by name, the engine's stages.
    run = subprocess.run([node, "--input-type=module", "-e", UI_SCRIPT,
                          f"{coll}/ui/#trace={trace_id}"], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    page = json.loads(run.stdout.strip().splitlines()[-1])
    # The page asks for /v1/models (what the engine runs on), which a collector has not.
    assert [e for e in page["pageErrors"] if "404" not in e] == []
    labels = page["labels"]
    for label in ("your backend (critical path, by span)", "engine", "auth", "rerank",
                  db_span, "queue", "prefill", "first_token"):
        assert label in labels, labels
    assert "moderation" not in labels
    facts = dict(page["facts"])
    assert "backend " in facts["whole path"] and "engine " in facts["whole path"]
    largest = max(stages, key=lambda s: s["duration_ms"])
    assert facts["largest segment"].startswith(largest["stage"] + " ")
