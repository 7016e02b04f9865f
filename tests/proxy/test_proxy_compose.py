"""The optional `proxy` compose service: the real CLI, on the port Prometheus scrapes,
exporting spans to the collector, in front of the engine unless told otherwise."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from tracer.proxy.cli import parse_listen

REPO = Path(__file__).resolve().parents[2]


def load(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())


def test_the_proxy_service_is_an_opt_in_profile_running_the_cli():
    services = load("docker-compose.yml")["services"]
    proxy = services["proxy"]
    assert proxy["profiles"] == ["proxy"]
    assert proxy["image"] == services["engine"]["image"]     # the same pinned image
    command = proxy["command"]
    assert command[:4] == ["python", "-m", "tracer", "proxy"]
    host, port = parse_listen(command[command.index("--listen") + 1])
    assert host == "0.0.0.0" and f"127.0.0.1:{port}:{port}" in proxy["ports"]
    upstream = command[command.index("--upstream") + 1]
    default = re.fullmatch(r"\$\{PROXY_UPSTREAM:-http://([\w-]+):(\d+)\}", upstream)
    assert default and default.group(1) in services
    assert f"{default.group(2)}" in str(services[default.group(1)]["ports"])
    endpoint = proxy["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint == services["engine"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert proxy["environment"]["OTEL_SERVICE_NAME"] == "ttftscope-proxy"


def test_prometheus_scrapes_the_proxy():
    config = load("dashboards/prometheus/prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "proxy"]
    command = load("docker-compose.yml")["services"]["proxy"]["command"]
    _, port = parse_listen(command[command.index("--listen") + 1])
    # Found by DNS, so no target reads "down" while the profile is off.
    (sd,) = job["dns_sd_configs"]
    assert (sd["names"], sd["type"], sd["port"]) == (["proxy"], "A", port)
    assert "static_configs" not in job
    assert job.get("metrics_path", "/metrics") == "/metrics"
