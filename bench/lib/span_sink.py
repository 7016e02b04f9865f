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
import subprocess
import sys
from pathlib import Path

from bench.lib.loopback import start_listening

ROOT = Path(__file__).resolve().parents[2]
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
    nginx = nginx_binary()
    if nginx is not None:
        prefix = tmp / "span-sink"
        prefix.mkdir(exist_ok=True)

        def argv_for(port: int) -> list[str]:
            (prefix / "nginx.conf").write_text(NGINX_SINK_CONF.format(prefix=prefix, port=port))
            return [nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"]
    else:
        def argv_for(port: int) -> list[str]:
            return [sys.executable, "-m", "tracer.testing.fake_upstream", "--port", str(port)]
    port, proc = start_listening(argv_for, tmp / "span-sink.log", cwd=ROOT)
    try:
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
