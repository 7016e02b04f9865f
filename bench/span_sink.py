"""An OTLP/HTTP stand-in for a collector, for the benchmarks that export spans.

The servers under test export their spans as in production (batches, OTLP/HTTP). What
receives them must not load the cores the measurement shares, since a real collector runs
elsewhere: a second nginx answering 200 to every POST does that; without nginx, the fake
upstream's Python sink.

    with span_sink(tmp_dir) as traces_url:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traces_url
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NGINX_SINK_CONF = """worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  client_max_body_size 64m;
  server {{
    listen 127.0.0.1:{port};
    location / {{ return 200 ""; }}
  }}
}}
"""


def nginx_binary() -> str | None:
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    return found if Path(found).exists() else None


@contextlib.contextmanager
def span_sink(tmp: Path):
    """Yields the traces URL of a running sink; stops it on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    nginx = nginx_binary()
    if nginx is not None:
        prefix = tmp / "span-sink"
        prefix.mkdir(exist_ok=True)
        (prefix / "nginx.conf").write_text(NGINX_SINK_CONF.format(prefix=prefix, port=port))
        proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"),
                                 "-g", "daemon off;"], **quiet)
    else:
        proc = subprocess.Popen([sys.executable, "-m", "tracer.proxy_fake_upstream",
                                 "--port", str(port)], **quiet)
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the span sink exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # polling a starting process; not a test
    raise TimeoutError(f"the span sink is not listening on {port} after {timeout_s}s")
