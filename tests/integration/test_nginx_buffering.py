"""Issue 11, the buffering detector end to end: real Chromium → a REAL nginx (the Debian
package, started here on loopback with a temporary prefix) → `python -m tracer proxy` → a fake
upstream that sends 12 content events 60 ms apart (tracer/testing/fake_upstream.py: a
deterministic origin, so the send spread is known and large).

The same page (tests/integration/pages/chat.html, served by nginx) runs under two nginx
configs, both with site-wide `gzip on` for text/event-stream:
- `proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;` — nginx holds the whole small
  stream back and releases it at the end: the proxy's in-band send times are spread over
  ~660 ms while the browser gets every event at once. Detected.
- `proxy_buffering off;` — events arrive as they are sent. Not detected.
The beacon goes back through nginx to the proxy's /v1/probe, whose ingest judges it: the
joined TTFT verdict (issue 31) is `buffering` under the first config only, counted once more
in `llm_ttft_cause_total{cause="buffering"}`.
"""
from __future__ import annotations

import json
import sys

import httpx
import pytest

from prom_support import free_port, wait_for
from topology_support import (decode_timing_token, metric_samples, nginx, open_page, process,
                              require_browser_stack)
from tracer.testing.fake_upstream import FakeUpstream

MODEL = "fake-model"
NUM_EVENTS, GAP_MS = 12, 60
BUFFERED = "llm_client_stream_buffered_total"
HELD_BACK = "llm_client_stream_held_back_seconds"
CAUSE = "llm_ttft_cause_total{{cause=\"{}\",model=\"%s\"}}" % MODEL
# The two configs differ in the buffering line only. Both compress text/event-stream (gzip on
# in topology_support.NGINX_CONF). Measured on this nginx: with buffering off, nginx flushes
# the gzip stream after each upstream read, so events still arrive one by one; with buffering
# on it never flushes, and the whole small stream comes out when the upstream ends.
# (Buffering on without gzip passes a chunked upstream's events on as they come at this pace:
# buffering alone is not the pitfall.)
CONFIGS = {
    "buffering_on": "proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;",
    "buffering_off": "proxy_buffering off;",
}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    node = require_browser_stack()
    upstream = FakeUpstream(chunks=NUM_EVENTS, gap_ms=GAP_MS).start()
    port = free_port()
    log = tmp_path_factory.mktemp("proxy") / "proxy.log"
    try:
        with process([sys.executable, "-m", "tracer", "proxy", "--upstream", upstream.base_url,
                      "--listen", f"127.0.0.1:{port}", "--served-model-name", MODEL],
                     port=port, health="/health", log=log,
                     env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) as base:
            yield node, base, port
    finally:
        upstream.stop()


@pytest.mark.parametrize("config", list(CONFIGS))
def test_nginx_proxy_buffering_is_detected_only_when_on(proxy, config, tmp_path):
    node, proxy_url, proxy_port = proxy
    before = metric_samples(proxy_url)
    with nginx(tmp_path, proxy_port, CONFIGS[config]) as front:
        out = open_page(node, f"{front}/page/chat.html?api=/v1&model={MODEL}&max_tokens=16")
        [sent] = out["beacons"]
        beacon = json.loads(sent["body"])
        trace_id = beacon["trace_id"]

        def judged():
            now = metric_samples(proxy_url)
            return now if now.get(f"{HELD_BACK}_count", 0) > before.get(f"{HELD_BACK}_count", 0) else None
        wait_for(judged, 15, "the proxy's verdict on the beacon")
        # The beacon was ingested on the proxy's event loop in one call (buffering metrics,
        # then the verdict's client half), so this read, served by the same loop, follows it.
        view = httpx.get(f"{proxy_url}/ui/api/trace/{trace_id}", timeout=5).json()
        after = metric_samples(proxy_url)

    assert beacon["outcome"] == "ok" and beacon["chunks"] == NUM_EVENTS, beacon
    send_ms = decode_timing_token(beacon["server"])["send_ms"]
    assert len(send_ms) == NUM_EVENTS
    send_spread = send_ms[-1] - send_ms[0]
    arrive_spread = beacon["chunk_ms"][-1] - beacon["chunk_ms"][0]
    assert send_spread >= (NUM_EVENTS - 1) * GAP_MS * 0.9   # the origin really streamed slowly
    buffered = config == "buffering_on"
    # what nginx physically did, seen in the browser's own arrival times
    if buffered:
        assert arrive_spread < 0.25 * send_spread, (arrive_spread, send_spread)
    else:
        assert arrive_spread > 0.5 * send_spread, (arrive_spread, send_spread)

    delta = after.get(BUFFERED, 0.0) - before.get(BUFFERED, 0.0)
    assert delta == (1 if buffered else 0), (config, delta)
    # held back: how much later than sent the events came, clock-free (send − arrival spread)
    held_back_s = after[f"{HELD_BACK}_sum"] - before.get(f"{HELD_BACK}_sum", 0.0)
    assert held_back_s == pytest.approx(max(send_spread - arrive_spread, 0) / 1e3, abs=1e-6)
    if buffered:
        assert held_back_s > 0.75 * send_spread / 1e3
    # the proxy's joined view (what /ui shows) says the same
    verdict = view["client"]["buffering"]
    assert verdict["buffered"] is buffered and verdict["num_events"] == NUM_EVENTS, verdict
    assert verdict["held_back_ms"] == pytest.approx(held_back_s * 1e3, abs=0.01)

    # the TTFT verdict: the stream held back by nginx is the cause, with its evidence
    cause = view["verdict"]["cause"]
    rose = after.get(CAUSE.format("buffering"), 0.0) - before.get(CAUSE.format("buffering"), 0.0)
    if buffered:
        assert cause == "buffering", view["verdict"]
        evidence = view["verdict"]["evidence"]
        assert evidence["held_back_ms"] > 0, evidence
        assert evidence["held_back_ms"] == pytest.approx(held_back_s * 1e3, abs=0.1)
        assert evidence["buffered_chunks"] == NUM_EVENTS, evidence
        assert "held back" in view["verdict"]["sentence"], view["verdict"]["sentence"]
        assert rose == 1, rose
    else:
        assert cause != "buffering", view["verdict"]
        assert rose == 0, rose
