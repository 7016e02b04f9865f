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
The beacon goes back through nginx to the proxy's /v1/probe, whose ingest judges it.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prom_support import free_port, require_binary, wait_for
from topology_support import (decode_timing_token, metric_samples, open_page, process,
                              require_browser_stack)
from tracer.testing.fake_upstream import FakeUpstream

MODEL = "fake-model"
NUM_EVENTS, GAP_MS = 12, 60
BUFFERED = "llm_client_stream_buffered_total"
HELD_BACK = "llm_client_stream_held_back_seconds"
PAGES = Path(__file__).with_name("pages")
NGINX_CONF = """worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  types {{ text/html html; text/javascript js; }}
  # site-wide compression, as many configs have it (and as the runbook warns about)
  gzip on;
  gzip_types text/event-stream text/javascript;
  gzip_min_length 0;
  server {{
    listen 127.0.0.1:{port};
    location /page/ {{ alias {pages}/; }}
    location / {{
      proxy_pass http://127.0.0.1:{proxy_port};
      {buffering}
    }}
  }}
}}
"""
# The two configs differ in the buffering line only. Both compress text/event-stream (gzip on
# above). Measured on this nginx: with buffering off, nginx flushes the gzip stream after each
# upstream read, so events still arrive one by one; with buffering on it never flushes, and
# the whole small stream comes out when the upstream ends. (Buffering on without gzip passes a
# chunked upstream's events on as they come at this pace: buffering alone is not the pitfall.)
CONFIGS = {
    "buffering_on": "proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;",
    "buffering_off": "proxy_buffering off;",
}


@contextlib.contextmanager
def nginx(tmp, proxy_port: int, buffering: str):
    binary = require_binary("nginx", "nginx")
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=tmp, port=port, proxy_port=proxy_port,
                                      pages=PAGES, buffering=buffering))
    proc = subprocess.Popen([binary, "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            if proc.poll() is not None:
                raise AssertionError(f"nginx exited {proc.returncode}: {proc.stderr.read()!r}")
            try:
                return httpx.get(base + "/page/chat.html", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(up, 30, "nginx")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)


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
        after = wait_for(judged, 15, "the proxy's verdict on the beacon")
        view = httpx.get(f"{proxy_url}/ui/api/trace/{trace_id}", timeout=5).json()

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
