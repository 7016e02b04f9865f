"""docker-compose.yml's production-topology parts: the standalone collector (the real CLI,
scraped by Prometheus, sharing the servers' beacon key) and the `replicas` profile (two
engines behind an nginx whose config real nginx accepts and that streams SSE unbuffered)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tracer.web.cli_options import parse_listen

REPO = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO / "dashboards" / "nginx" / "replicas.conf"


def load(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())


def test_the_collector_service_runs_the_cli_with_the_shared_key_and_is_scraped():
    services = load("docker-compose.yml")["services"]
    collector = services["collector"]
    command = collector["command"]
    assert command[:4] == ["python", "-m", "tracer", "collect"]
    host, port = parse_listen(command[command.index("--listen") + 1])
    assert host == "0.0.0.0" and f"127.0.0.1:{port}:{port}" in collector["ports"]
    key = collector["environment"]["TTFTSCOPE_BEACON_KEY"]
    for name in ("engine", "engine-a", "engine-b", "proxy"):
        assert services[name]["environment"]["TTFTSCOPE_BEACON_KEY"] == key, name
    assert collector["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == \
        services["engine"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    jobs = {j["job_name"]: j for j in load("dashboards/prometheus/prometheus.yml")["scrape_configs"]}
    assert jobs["collector"]["static_configs"][0]["targets"] == [f"collector:{port}"]
    assert jobs["engine-replicas"]["dns_sd_configs"][0]["names"] == ["engine-a", "engine-b"]


def test_the_replicas_profile_is_two_engines_behind_nginx():
    services = load("docker-compose.yml")["services"]
    a, b, lb = services["engine-a"], services["engine-b"], services["lb"]
    assert a["profiles"] == b["profiles"] == lb["profiles"] == ["replicas"]
    assert a["image"] == b["image"] == services["engine"]["image"]
    assert a["command"] == b["command"] and "--forwarded-allow-ips" in a["command"]
    assert any(v.endswith(":/etc/nginx/conf.d/default.conf:ro") and "replicas.conf" in v
               for v in lb["volumes"])
    conf = NGINX_CONF.read_text()
    for directive in ("proxy_buffering off;", "proxy_http_version 1.1;",
                      'proxy_set_header Connection "";', "gzip off;",
                      "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"):
        assert directive in conf
    assert re.search(r"proxy_read_timeout \d+s;", conf)
    assert {"engine-a:8000", "engine-b:8000"} <= set(re.findall(r"server ([\w-]+:\d+);", conf))


def test_real_nginx_accepts_the_replicas_config(tmp_path):
    nginx = shutil.which("nginx") or shutil.which("/usr/sbin/nginx")
    if nginx is None:
        pytest.fail("`nginx` is not installed: apt-get install -y nginx-light (Debian package)")
    # The compose service names resolve only inside compose: loopback stands in for them.
    conf = NGINX_CONF.read_text().replace("engine-a:8000", "127.0.0.1:1").replace(
        "engine-b:8000", "127.0.0.1:2").replace("listen 8300;", "listen 127.0.0.1:18300;")
    (tmp_path / "replicas.conf").write_text(conf)
    (tmp_path / "nginx.conf").write_text(
        f"error_log {tmp_path}/error.log;\npid {tmp_path}/nginx.pid;\nevents {{}}\n"
        f"http {{ access_log off; client_body_temp_path {tmp_path}; "
        f"proxy_temp_path {tmp_path}/proxy; include {tmp_path}/replicas.conf; }}\n")
    done = subprocess.run([nginx, "-t", "-q", "-p", str(tmp_path), "-c",
                           str(tmp_path / "nginx.conf")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
