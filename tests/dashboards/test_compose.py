"""docker-compose.yml, the Dockerfile and the service configs agree with each other.

No container engine runs here: these tests read the files and check that every name, port,
path and URL one of them uses is the one the other side declares.
"""
from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
import yaml

from dashboards_support import DASHBOARDS, REPO, load_module, load_yaml

PROVISIONING = DASHBOARDS / "grafana" / "provisioning"


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_yaml(REPO / "docker-compose.yml")


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def container_ports(service: dict) -> set[int]:
    """Ports a service listens on inside the network: published targets and `expose`."""
    published = {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}
    return published | {int(p) for p in service.get("expose", [])}


def bind_mounts(service: dict) -> dict[str, str]:
    """container path -> repo-relative host path, for the ./ bind mounts of a service."""
    mounts = (v.split(":") for v in service.get("volumes", []))
    return {m[1]: m[0] for m in mounts if m[0].startswith("./")}


def url_points_at(url: str, services: dict) -> None:
    parsed = urlparse(url if "://" in url else f"//{url}")
    assert parsed.hostname in services, url
    assert parsed.port in container_ports(services[parsed.hostname]), url


def test_every_yaml_file_parses():
    paths = [REPO / "docker-compose.yml", *DASHBOARDS.rglob("*.yml"), *DASHBOARDS.rglob("*.yaml")]
    templates = DASHBOARDS / "templates"
    for path in paths:
        if templates not in path.parents:     # templates hold @@MARKERS@@, not YAML values
            assert yaml.safe_load(path.read_text()) is not None, path


def test_every_image_is_pinned(services):
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and "/" not in tag, (name, image)
        assert tag != "latest", (name, image)
    base_images = re.findall(r"^FROM\s+(\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert base_images and all(re.fullmatch(r"[\w./-]+:[\w.-]*\d[\w.-]*", i) for i in base_images)


def test_every_bind_mounted_file_exists(services):
    mounts = [(name, host) for name, s in services.items() for host in bind_mounts(s).values()]
    assert len(mounts) >= 7
    for name, host in mounts:
        assert (REPO / host).exists(), (name, host)


def test_engine_runs_the_server_and_exports_to_the_collector(services):
    collector = load_yaml(DASHBOARDS / "otel-collector.yaml")
    http_endpoint = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    http_port = int(http_endpoint.rsplit(":", 1)[1])
    for name in ("engine", "engine-gpu"):
        engine = services[name]
        command = engine["command"]
        assert command[:4] == ["python", "-m", "instrumented_engine", "serve"]
        assert command[command.index("--host") + 1] == "0.0.0.0"
        assert int(command[command.index("--port") + 1]) in container_ports(engine)
        endpoint = engine["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
        url_points_at(endpoint, services)
        assert urlparse(endpoint).port == http_port


def test_gpu_engine_is_a_profile_that_reserves_nvidia_devices(services):
    gpu = services["engine-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert "profiles" not in services["engine"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "/whl/cu" in gpu["build"]["args"]["TORCH_INDEX_URL"]


def test_dockerfile_installs_cpu_torch_by_default():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r'^ARG TORCH_SPEC="torch==2\.13\.0"$', dockerfile, re.M)
    assert re.search(r'^ARG TORCH_INDEX_URL="https://download\.pytorch\.org/whl/cpu"$',
                     dockerfile, re.M)
    assert re.search(r"^FROM python:3\.11[\w.-]*-slim", dockerfile, re.M)
    for path in re.findall(r"^COPY\s+(.+?)\s+\S+$", dockerfile, re.M):
        for part in path.split():
            if part != "README.md":     # written by the lead; required by pyproject
                assert (REPO / part).exists(), part


def test_prometheus_scrapes_the_engine_and_alerts_alertmanager(services):
    prometheus = services["prometheus"]
    assert "--enable-feature=exemplar-storage" in prometheus["command"]
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    mounts = bind_mounts(prometheus)
    config_path = config_flag.split("=", 1)[1]
    assert mounts[config_path] == "./dashboards/prometheus/prometheus.yml"
    config = load_yaml(DASHBOARDS / "prometheus" / "prometheus.yml")
    # rule_files resolve next to the config file, inside the container too.
    config_dir = config_path.rsplit("/", 1)[0]
    for rule_file in config["rule_files"]:
        mounted_dir = mounts[f"{config_dir}/{rule_file.split('/')[0]}"]
        assert (REPO / mounted_dir / rule_file.split("/", 1)[1]).exists()
    engine = next(j for j in config["scrape_configs"] if j["job_name"] == "engine")
    targets = [t for c in engine["static_configs"] for t in c["targets"]]
    assert {t.split(":")[0] for t in targets} == {"engine", "engine-gpu"}
    for target in targets:
        url_points_at(target, services)
    for am in config["alerting"]["alertmanagers"]:
        for target in am["static_configs"][0]["targets"]:
            url_points_at(target, services)


def test_grafana_datasources_point_at_services_and_link_exemplars_to_tempo(services):
    datasources = {d["type"]: d for d in load_yaml(PROVISIONING / "datasources" /
                                                    "datasources.yml")["datasources"]}
    prometheus, tempo = datasources["prometheus"], datasources["tempo"]
    for datasource in (prometheus, tempo):
        url_points_at(datasource["url"], services)
    assert tempo["uid"] == "tempo"
    assert prometheus["jsonData"]["exemplarTraceIdDestinations"] == [
        {"datasourceUid": tempo["uid"], "name": "trace_id"}]
    tempo_port = load_yaml(DASHBOARDS / "tempo.yaml")["server"]["http_listen_port"]
    assert urlparse(tempo["url"]).port == tempo_port
    # The dashboards and the Grafana alert query the provisioned Prometheus by uid.
    for name in ("ttft-attribution.json", "engine.json"):
        text = (DASHBOARDS / "generated" / name).read_text()
        assert set(re.findall(r'"uid": "([^"]+)"', text)) >= {prometheus["uid"]}
    alert = load_yaml(PROVISIONING / "alerting" / "ttft-alerts.yml")["groups"][0]["rules"][0]
    assert alert["data"][0]["datasourceUid"] == prometheus["uid"]


def test_grafana_serves_the_generated_dashboards_with_ttft_as_home(services):
    grafana = services["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert 3000 in container_ports(grafana)
    mounts = bind_mounts(grafana)
    assert mounts["/etc/grafana/provisioning"] == "./dashboards/grafana/provisioning"
    provider = load_yaml(PROVISIONING / "dashboards" / "dashboards.yml")["providers"][0]
    folder = provider["options"]["path"]
    assert mounts[folder] == "./dashboards/generated"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(folder + "/")
    assert (REPO / mounts[folder] / home.removeprefix(folder + "/")).name == "ttft-attribution.json"
    assert (REPO / mounts[folder] / "ttft-attribution.json").exists()


def test_collector_tail_samples_errors_slow_ttft_and_a_share_of_the_rest(services):
    config = load_yaml(DASHBOARDS / "otel-collector.yaml")
    policies = {p["type"]: p for p in config["processors"]["tail_sampling"]["policies"]}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    thresholds = load_module(DASHBOARDS / "thresholds.py", "ttftscope_thresholds")
    (condition,) = policies["ottl_condition"]["ottl_condition"]["span"]
    attribute, bound = re.fullmatch(r'attributes\["([\w.]+)"\] > ([\d.]+)', condition).groups()
    assert attribute == "gen_ai.response.time_to_first_chunk"
    assert float(bound) == thresholds.DEFAULT_THRESHOLDS.ttft_p95_s
    assert policies["latency"]["latency"]["threshold_ms"] > 0
    assert 0 < policies["probabilistic"]["probabilistic"]["sampling_percentage"] < 100
    pipeline = config["service"]["pipelines"]["traces"]
    assert "tail_sampling" in pipeline["processors"]
    assert pipeline["receivers"] == ["otlp"]
    (exporter,) = pipeline["exporters"]
    endpoint = config["exporters"][exporter]["endpoint"]
    url_points_at(endpoint, services)
    tempo_grpc = load_yaml(DASHBOARDS / "tempo.yaml")["distributor"]["receivers"]["otlp"]
    tempo_grpc_port = urlparse("//" + endpoint).port
    assert tempo_grpc["protocols"]["grpc"]["endpoint"].endswith(f":{tempo_grpc_port}")
    for port in (4317, 4318):
        assert port in container_ports(services["otel-collector"])
