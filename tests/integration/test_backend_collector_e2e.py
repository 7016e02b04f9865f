"""Issue 11, production topology in real Chromium: browser → a product web backend (FastAPI +
httpx, tests/integration/backend_app.py) → the engine (real SmolLM2), with the probe's beacon
sent to a separate `python -m tracer collect` process that never saw the request.

The collector can only compute client TTFT and network + gateway time from what the beacon
carries: the engine's signed in-band timing line (`: ttft-timing <token>`), which the engine
writes because the backend forwarded the probe's `X-TTFT-Timing: 1`, and which the probe read
from the stream. Once with plain fetch, once with the real `openai` npm SDK as the page's client.
"""
from __future__ import annotations

import json
import secrets

import pytest

from instrumented_engine.server.app import ServerSettings
from tracer.web.observability import ObservabilitySettings
from prom_support import wait_for
from topology_support import (backend, collector, decode_timing_token, metric_samples, open_page,
                              require_browser_stack)

CLIENT_TTFT = "llm_client_time_to_first_token_seconds"
NETWORK = "llm_client_network_overhead_seconds"


@pytest.fixture(scope="module")
def topology(server_factory, tmp_path_factory):
    node = require_browser_stack()
    key = secrets.token_hex(16)
    engine = server_factory(ServerSettings(observability=ObservabilitySettings(beacon_key=key)))
    logs = tmp_path_factory.mktemp("topology")
    with backend(engine.base_url, logs / "backend.log") as web, \
            collector(key, logs / "collector.log", "--served-model-name", engine.model,
                      "--cors-origin", web) as coll:
        yield node, engine, web, coll


@pytest.mark.parametrize("page", ["chat.html", "openai.html"])
def test_beacon_through_a_web_backend_is_measured_by_a_separate_collector(topology, page):
    node, engine, web, coll = topology
    before = metric_samples(coll)
    url = (f"{web}/page/{page}?api=/api/v1&model={engine.model}&max_tokens=8"
           f"&collector={coll}/v1/probe&prompt=What+is+the+capital+of+France%3F")
    out = open_page(node, url)
    assert out["result"]["text"].strip(), out
    [sent] = out["beacons"]
    assert sent["url"] == f"{coll}/v1/probe"
    beacon = json.loads(sent["body"])
    assert beacon["outcome"] == "ok" and beacon["status"] == 200 and beacon["chunks"] >= 1

    # The engine served this very trace (the backend forwarded the probe's traceparent)...
    trace_id = beacon["trace_id"]
    record = wait_for(lambda: engine.parts.obs.store.get(trace_id), 10, "the engine's record")
    assert beacon["traceparent"].split("-")[1] == trace_id
    # ...and answered the forwarded X-TTFT-Timing with its signed timing, which the probe read.
    assert "server" in beacon, "no in-band timing line reached the probe through the backend"
    timing = decode_timing_token(beacon["server"])
    assert timing["trace_id"] == trace_id == record.trace_id
    assert timing["source"] == "engine" and timing["span_id"] == record.span_id
    assert timing["ttft_ms"] == pytest.approx(record.ttft_ns / 1e6, abs=0.01)
    # The beacon went to the collector only: the engine's in-process join never saw it.
    assert record.client is None

    # The collector alone turned it into client TTFT and network + gateway time.
    def observed():
        now = metric_samples(coll)
        return now if now.get(f"{NETWORK}_count", 0) > before.get(f"{NETWORK}_count", 0) else None
    after = wait_for(observed, 15, "the collector's client metrics")
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in
             (f"{CLIENT_TTFT}_count", f"{CLIENT_TTFT}_sum", f"{NETWORK}_count", f"{NETWORK}_sum")}
    assert delta[f"{CLIENT_TTFT}_count"] == 1 and delta[f"{NETWORK}_count"] == 1, delta
    client_ttft_ms = beacon["t"]["first_token"]
    assert delta[f"{CLIENT_TTFT}_sum"] == pytest.approx(client_ttft_ms / 1e3, abs=1e-6)
    # network + gateway = client TTFT − server TTFT, both from the beacon alone
    assert delta[f"{NETWORK}_sum"] == pytest.approx((client_ttft_ms - timing["ttft_ms"]) / 1e3,
                                                    abs=1e-6)
    # the browser cannot see the first token before the engine sent it
    assert client_ttft_ms >= timing["ttft_ms"] - record.stage_ns("send") / 1e6
