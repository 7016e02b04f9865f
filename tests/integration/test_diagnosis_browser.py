"""Issue 31, the `network` verdict end to end: real Chromium → a REAL nginx (buffering off)
→ `python -m tracer proxy` → a fake upstream whose first token comes `FIRST_TOKEN_MS` after
the request (nginx adds the fake's `x-fake-first-token-delay-ms` header: an engine's
queue and prefill, so the server's TTFT is known and far above loopback's few ms).

A delay is put between the browser and the server with Chromium's own network emulation
(DevTools' `Network.emulateNetworkConditions`, `latency`, through a CDP session:
tests/integration/page_driver.mjs `latencyMs`). The beacon joins the proxy's record; the
joined verdict is `network` (client TTFT − server TTFT is more than the whole server TTFT
and above the normal, which a fresh proxy does not know yet: 0), counted once more in
`llm_ttft_cause_total{cause="network"}`. The same page without the delay is not `network`.
"""
from __future__ import annotations

import json
import sys

import httpx
import pytest

from prom_support import free_port, wait_for
from topology_support import metric_samples, nginx, open_page, process, require_browser_stack
from tracer.testing.fake_upstream import FakeUpstream

MODEL = "fake-model"
NUM_EVENTS = 4
FIRST_TOKEN_MS = 300
LATENCY_MS = 1500
CLIENT_JOINS = "llm_client_stream_held_back_seconds_count"   # one per joined beacon
DIRECTIVES = (f"proxy_buffering off; proxy_set_header x-fake-first-token-delay-ms "
              f"{FIRST_TOKEN_MS};")


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    """node, the proxy's URL, and nginx's in front of it (a fresh proxy: no network normal)."""
    node = require_browser_stack()
    upstream = FakeUpstream(chunks=NUM_EVENTS, gap_ms=0).start()
    port = free_port()
    log = tmp_path_factory.mktemp("proxy") / "proxy.log"
    try:
        with process([sys.executable, "-m", "tracer", "proxy", "--upstream", upstream.base_url,
                      "--listen", f"127.0.0.1:{port}", "--served-model-name", MODEL],
                     port=port, health="/health", log=log,
                     env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) as proxy_url, \
                nginx(tmp_path_factory.mktemp("nginx"), port, DIRECTIVES) as front:
            yield node, proxy_url, front
    finally:
        upstream.stop()


def _joined_verdict(topology, latency_ms: float | None) -> tuple[dict, dict, dict]:
    """Loads the chat page (through nginx, with `latency_ms` of emulated latency); its
    beacon, the proxy's view of the trace once the beacon joined, and the cause counter's
    rise for each cause."""
    node, proxy_url, front = topology
    before = metric_samples(proxy_url)
    out = open_page(node, f"{front}/page/chat.html?api=/v1&model={MODEL}&max_tokens=8",
                    latency_ms=latency_ms)
    [sent] = out["beacons"]
    beacon = json.loads(sent["body"])
    assert beacon["outcome"] == "ok" and beacon["chunks"] == NUM_EVENTS, beacon

    def joined():
        now = metric_samples(proxy_url)
        return now.get(CLIENT_JOINS, 0) > before.get(CLIENT_JOINS, 0)
    wait_for(joined, 15, "the proxy's join of the beacon")
    # The beacon was ingested on the proxy's event loop in one call (client metrics, then
    # the verdict's client half), so this read, served by the same loop, follows it.
    view = httpx.get(f"{proxy_url}/ui/api/trace/{beacon['trace_id']}", timeout=5).json()
    after = metric_samples(proxy_url)
    rose = {k: after[k] - before.get(k, 0.0) for k in after
            if k.startswith("llm_ttft_cause_total{")}
    return beacon, view, rose


def _labels(cause: str) -> str:
    return f'llm_ttft_cause_total{{cause="{cause}",model="{MODEL}"}}'


def test_a_delay_between_browser_and_server_is_the_network_verdict(topology):
    # without the delay first: loopback adds a few ms, far less than the server's TTFT
    _, plain, plain_rose = _joined_verdict(topology, None)
    assert plain["server_ttft_ms"] >= FIRST_TOKEN_MS * 0.9, plain["server_ttft_ms"]
    assert plain["client"]["network_overhead_ms"] < plain["server_ttft_ms"], plain["client"]
    assert plain["verdict"]["cause"] != "network", plain["verdict"]
    assert plain_rose.get(_labels("network"), 0) == 0, plain_rose

    beacon, view, rose = _joined_verdict(topology, LATENCY_MS)
    verdict = view["verdict"]
    assert verdict["cause"] == "network", verdict
    evidence = verdict["evidence"]
    # Chromium holds each response back until `latency` after its request went out: the
    # browser's TTFT is at least the latency, the server's is unchanged
    assert evidence["client_ttft_ms"] >= LATENCY_MS, evidence
    assert evidence["client_ttft_ms"] == pytest.approx(beacon["t"]["first_token"], abs=0.1)
    assert evidence["server_ttft_ms"] == pytest.approx(view["server_ttft_ms"], abs=0.1)
    assert evidence["server_ttft_ms"] < LATENCY_MS / 2, evidence
    assert evidence["network_ms"] == pytest.approx(
        evidence["client_ttft_ms"] - evidence["server_ttft_ms"], abs=0.2)
    assert evidence["network_ms"] >= LATENCY_MS - evidence["server_ttft_ms"], evidence
    assert evidence["normal_network_ms"] is None, evidence   # too few beacons for a normal
    assert verdict["excess_ms"] == pytest.approx(evidence["network_ms"], abs=0.1)
    assert verdict["findings"][0]["cause"] == "network", verdict["findings"]
    sentence = verdict["sentence"]
    assert sentence.startswith("The network between the browser and the server: the "
                               f"browser waited {evidence['client_ttft_ms']:g} ms"), sentence
    assert f"{evidence['network_ms']:g} ms between them" in sentence, sentence
    assert rose[_labels("network")] == 1, rose
