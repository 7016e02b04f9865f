"""`python -m tracer collect` as a process: it refuses to start without a beacon key, and
serves /health, /v1/probe and /metrics on the address given."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx

from tracer.web.inband import InbandTiming, encode_token
from tracer.web.probe.token import BeaconSigner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TTFTSCOPE_BEACON_KEY",
                                                           "OTEL_EXPORTER_OTLP_ENDPOINT")}
    return env


def test_collect_without_a_beacon_key_exits_2():
    done = subprocess.run([sys.executable, "-m", "tracer", "collect", "--listen",
                           "127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                          env=_env())
    assert done.returncode == 2 and "--beacon-key" in done.stderr


def test_collect_serves_probe_metrics_and_health():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tracer", "collect", "--listen",
                             f"127.0.0.1:{port}", "--beacon-key", "cli-key",
                             "--served-model-name", "m"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline, wake = time.monotonic() + 60, threading.Event()
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(base + "/health", timeout=1).json() == {"status": "ok"}:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the collector did not start"
            wake.wait(0.05)   # polling a starting process with a deadline
        t = InbandTiming("7" * 32, "8" * 16, "proxy", "m", time.time_ns() - 10**9, 1.0, 12.0,
                         (12.0, 30.0, 52.0))
        beacon = {"v": 1, "trace_id": t.trace_id, "outcome": "ok", "chunks": 3,
                  "chunk_ms": [40.0, 58.0, 80.0], "server": encode_token(t, BeaconSigner(b"cli-key")),
                  "t": {"start": 0, "headers": 25.0, "first_byte": 40.0, "first_token": 40.0,
                        "end": 90.0}}
        r = httpx.post(base + "/v1/probe", content=json.dumps(beacon),
                       headers={"content-type": "text/plain"}, timeout=10)
        assert r.status_code == 202
        metrics = httpx.get(base + "/metrics", timeout=10).text
        for path in ("/health", "/metrics"):     # HEAD as GET, without the content
            head = httpx.head(base + path, timeout=10)
            assert (head.status_code, head.content) == (200, b""), path
        assert 'llm_client_time_to_first_token_seconds_count{model="m"} 1.0' in metrics
        assert 'llm_client_network_overhead_seconds_sum{model="m"} 0.028' in metrics
        assert 'llm_probe_beacons_total{outcome="accepted"} 1.0' in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=30)
