"""Helpers for the production-topology browser tests (issue 11): loopback processes (the web
backend, `python -m tracer collect`, the proxy, nginx), the Chromium page driver, the
collector's metrics and the in-band timing token.

Every process is bounded: started on a free loopback port, waited for by polling with a
deadline, and stopped (by its own pid) even when the test fails.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prom_support import free_port, require_binary, wait_for

REPO = Path(__file__).resolve().parents[2]
PAGE_DRIVER = Path(__file__).with_name("page_driver.mjs")
CHROMIUM = Path("/usr/bin/chromium")
PAGES = Path(__file__).with_name("pages")
# nginx in front of the proxy: the test pages at /page/, everything else proxied with the
# location's `directives` (buffering, headers).
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
      {directives}
    }}
  }}
}}
"""


def require_browser_stack() -> str:
    """node, with Chromium, playwright-core and the openai SDK installed; fails naming the fix."""
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium chromium-driver")
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is missing: apt-get install -y nodejs npm")
    for package in ("playwright-core", "openai"):
        if not (REPO / "frontend_probe" / "node_modules" / package).is_dir():
            pytest.fail(f"npm {package} is missing: cd frontend_probe && npm ci")
    return node


def stop(proc: subprocess.Popen) -> None:
    """Terminate, and kill what does not exit within 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@contextlib.contextmanager
def process(argv: list[str], *, port: int, health: str, env: dict | None = None,
            log: Path, timeout_s: float = 60):
    """A child process serving `http://127.0.0.1:{port}{health}`; yields its base URL."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            if proc.poll() is not None:
                raise AssertionError(f"{argv[:4]} exited {proc.returncode}:\n"
                                     f"{log.read_text(errors='replace')[-3000:]}")
            try:
                return httpx.get(base + health, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(up, timeout_s, f"{' '.join(argv[:4])} on port {port}")
        yield base
    finally:
        stop(proc)


def backend(engine_url: str, log: Path):
    """tests/integration/backend_app.py under uvicorn, forwarding to `engine_url`."""
    port = free_port()
    return process([sys.executable, "-m", "uvicorn", "tests.integration.backend_app:app",
                    "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                   port=port, health="/health", env={"TTFT_ENGINE_URL": engine_url}, log=log)


def collector(beacon_key: str, log: Path, *extra: str):
    """`python -m tracer collect` on loopback, sharing the servers' beacon key."""
    port = free_port()
    return process([sys.executable, "-m", "tracer", "collect", "--listen", f"127.0.0.1:{port}",
                    "--beacon-key", beacon_key, *extra], port=port, health="/health", log=log,
                   env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})


def open_page(node: str, url: str, timeout_s: float = 90, *,
              latency_ms: float | None = None) -> dict:
    """Runs tests/integration/page_driver.mjs on `url`: {result, beacons, pageErrors}.
    `latency_ms`: Chromium's own network emulation adds that much latency to every request."""
    opts = {"url": url, "timeoutMs": int(timeout_s * 1000)}
    if latency_ms:
        opts["latencyMs"] = latency_ms
    run = subprocess.run([node, str(PAGE_DRIVER), json.dumps(opts)], capture_output=True,
                         text=True, timeout=timeout_s + 60, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["pageErrors"] == [], out["pageErrors"]
    assert "error" not in out["result"], out["result"]["error"]
    return out


@contextlib.contextmanager
def nginx(tmp: Path, proxy_port: int, directives: str):
    """A real nginx (the Debian package) on a free loopback port with `tmp` as its prefix, in
    front of the proxy on `proxy_port` (NGINX_CONF); yields its base URL, stops it by pid."""
    binary = require_binary("nginx", "nginx")
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=tmp, port=port, proxy_port=proxy_port,
                                      pages=PAGES, directives=directives))
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
        stop(proc)


def metric_samples(base_url: str) -> dict[str, float]:
    """`name{labels}` → value of every sample on `base_url`/metrics, and `name` → the sum
    over its label sets."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "le")
            if "le" in s.labels:
                continue
            out[f"{s.name}{{{labels}}}"] = s.value
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def decode_timing_token(token: str) -> dict:
    """The JSON payload of an in-band `ttft-timing` token (`<b64url payload>.<b64url sig>`)."""
    payload, _, sig = token.partition(".")
    assert payload and len(sig) == 43, token
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
