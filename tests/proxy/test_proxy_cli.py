"""`python -m tracer proxy`: the real command in a subprocess, in front of the fake upstream."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from proxy_support import closed_port, wait_until
from tracer.proxy.cli import discover_model_names, parse_listen
from tracer.testing.fake_upstream import MODEL


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_proxy_command_serves_traces_and_discovers_the_models(fake_upstream, tmp_path):
    port = closed_port()
    log = (tmp_path / "proxy.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tracer", "proxy", "--upstream", fake_upstream.base_url,
         "--listen", f"127.0.0.1:{port}", "--log-format", "json"],
        stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: process.poll() is not None or _healthy(base_url), 60)
        assert process.poll() is None, (tmp_path / "proxy.log").read_text()
        with httpx.stream("POST", base_url + "/v1/chat/completions",
                          json={"model": MODEL, "stream": True, "messages": []}) as response:
            assert response.status_code == 200 and response.headers["x-request-id"]
            response.read()
        rows = httpx.get(base_url + "/ui/api/requests").json()["requests"]
        assert len(rows) == 1 and rows[0]["model"] == MODEL      # discovered, not "other"
        metrics = httpx.get(base_url + "/metrics").text
        assert f'llm_requests_total{{finish_reason="stop",model="{MODEL}"}} 1.0' in metrics
    finally:
        process.terminate()
        assert process.wait(timeout=30) is not None
    # One JSON object a line, however it is spaced (the writer is orjson since 3a12fb2).
    events = [json.loads(line).get("event") for line in
              (tmp_path / "proxy.log").read_text().splitlines() if line.startswith("{")]
    assert "request_finished" in events


def test_bad_listen_address_exits_2():
    run = subprocess.run([sys.executable, "-m", "tracer", "proxy", "--upstream",
                          "http://127.0.0.1:9", "--listen", "nonsense"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "HOST:PORT" in run.stderr


@pytest.mark.parametrize("listen,expected", [("0.0.0.0:8100", ("0.0.0.0", 8100)),
                                             ("[::1]:80", ("::1", 80))])
def test_parse_listen(listen, expected):
    assert parse_listen(listen) == expected


def test_discovery_gives_up_on_a_dead_upstream_within_its_timeout():
    assert discover_model_names(f"http://127.0.0.1:{closed_port()}", timeout_s=0.3) == ()
