"""Real Prometheus and Alertmanager against the live engine, configured from dashboards/.

One module-scoped stack: the engine on loopback (fresh registry), Prometheus with the
repository's prometheus.yml and rules (intervals cut to 1 s, alert rules rendered with a
TTFT threshold below anything a real request takes), Alertmanager with the rendered
alertmanager.yml (only the webhook URL differs from the committed one), and the stack's own
alert receiver (dashboards/alert_receiver/receiver.py). `python -m tracer bench` drives the
load, a few direct requests end on a stop, and one probe beacon per served request feeds the
client metrics. Then every dashboard query and recording rule must return data, the TTFT alert
must fire and reach the receiver, and the TTFT exemplars must name traces the engine served.

Needs the Debian packages `prometheus` and `prometheus-alertmanager`; without them it fails.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from tracer.record.stages import PROXY_STAGE_LABELS, SERVER_STAGES
from tracer.sinks.metrics import OTHER

from prom_support import (
    DASHBOARDS, REPO, Daemon, Endpoints, PrometheusAPI, alert_receiver, alertmanager_config,
    finite_values, free_port, prometheus_config, require_binary, resolve_variables, substitute,
    wait_for,
)

INTERVAL = "1s"
TTFT_THRESHOLD_S = 0.001       # every real request is slower: the alert must fire
ALERT_FOR = "5s"
# Grafana's built-ins: $__rate_interval is max(4 x the data source's 15 s scrape interval,
# $__interval + scrape interval) = 1m; the range covers the whole load of this test.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m",
                    "__range_s": "300", "__range_ms": "300000", "__interval_ms": "15000"}
# Series this machine cannot produce, with the reason. A query reading one must return
# nothing, unless the engine does export it (a GPU with NVML): then it must return data.
# The collector's whole-path families: no collector runs in this stack (its panels' queries
# are evaluated on known data by promtool in tests/dashboards/test_path_panels.py); here
# Prometheus must accept and evaluate them, with or without data.
COLLECTOR_FAMILIES = re.compile(r"\b(llm_path_segment_seconds|llm_collector_|llm_beacon_relay_)")
NO_DATA_HERE = {
    "llm_gpu_": "GPU gauges come from NVML; a CPU-only machine exports no llm_gpu_* series",
    'stage="upstream_': "the proxy's own stages; this stack scrapes the engine, no proxy",
}
# Stages only a proxy records: its five and those of a record joined with its engine's
# timing (docs/architecture.md, "Inside the engine"), less the nine it shares with the engine.
PROXY_ONLY_STAGES = frozenset(PROXY_STAGE_LABELS) - frozenset(SERVER_STAGES)
NUM_BENCH_REQUESTS = 12
STOP_REQUESTS = (  # (messages, extra body) that end with finish_reason "stop"
    ([{"role": "user", "content": "What is the capital of France?"}], {"stop": ["."]}),
    ([{"role": "user", "content": "Reply with one word: yes or no. Is water wet?"}], {}),
)


@dataclass(slots=True, frozen=True)
class Stack:
    """What the tests read: `stack.api.query(expr, stack.eval_at_s)`, `stack.receiver.url`."""

    live: object               # tests/conftest.py LiveServer
    api: PrometheusAPI
    receiver: Daemon           # dashboards/alert_receiver/receiver.py
    alertmanager_config: dict  # the file Alertmanager runs with
    endpoints: Endpoints
    load_start_s: float        # wall clock, for exemplar ranges
    eval_at_s: float           # every panel query is evaluated at this instant
    num_requests: int
    num_beacons: int


def _render_rules(out_dir: Path, webhook_url: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS / "prometheus" / "render_rules.py"),
         "--ttft-threshold-s", str(TTFT_THRESHOLD_S), "--for", ALERT_FOR,
         "--webhook-url", webhook_url, "--out-dir", str(out_dir)],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return out_dir


def _alertmanager(binary: str, tmp: Path, rendered: Path) -> Daemon:
    # The rendered file waits 10 s / 1 m before sending; a test overrides that to 1 s / 2 s.
    config = alertmanager_config(yaml.safe_load((rendered / "alertmanager.yml").read_text()),
                                 group_wait="1s", group_interval="2s")
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return Daemon("alertmanager", lambda port: [
        binary, f"--config.file={path}", f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
        "--log.level=warn"], log_dir=tmp)


def _prometheus(binary: str, tmp: Path, rendered: Path, engine: str, am: str) -> Daemon:
    repo_config = yaml.safe_load((DASHBOARDS / "prometheus" / "prometheus.yml").read_text())
    conf_dir = tmp / "prometheus"
    for rule_file in repo_config["rule_files"]:   # same relative paths as in the repository
        source = rendered / Path(rule_file).name
        source = source if source.exists() else DASHBOARDS / "prometheus" / rule_file
        (conf_dir / rule_file).parent.mkdir(parents=True, exist_ok=True)
        (conf_dir / rule_file).write_text(source.read_text())

    def args(port: int) -> list[str]:
        endpoints = Endpoints(engine=engine, prometheus=f"127.0.0.1:{port}", alertmanager=am)
        config = prometheus_config(repo_config, endpoints, INTERVAL)
        (conf_dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        return [binary, f"--config.file={conf_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'prom-data'}", f"--web.listen-address=127.0.0.1:{port}",
                "--enable-feature=exemplar-storage", "--log.level=warn"]
    return Daemon("prometheus", args, log_dir=tmp)


def _drive_load(live, tmp: Path) -> int:
    """The bench's requests (shared prefix, `length` finishes) plus a few `stop` ones."""
    out = tmp / "bench.json"
    bench = subprocess.run(
        [sys.executable, "-m", "tracer", "bench", "--base-url", live.base_url, "--model",
         live.model, "--num-requests", str(NUM_BENCH_REQUESTS), "--concurrency", "3",
         "--prompt-tokens", "96", "--shared-prefix-ratio", "0.75", "--output-tokens", "6",
         "--timeout-s", "60", "--no-progress", "--output-json", str(out)],
        capture_output=True, text=True, timeout=180, cwd=REPO)
    assert bench.returncode == 0, bench.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert (summary["completed"], summary["failed"]) == (NUM_BENCH_REQUESTS, 0), summary
    with httpx.Client(base_url=live.base_url, timeout=60, trust_env=False) as client:
        for messages, extra in STOP_REQUESTS:
            body = {"model": live.model, "messages": messages, "max_tokens": 48,
                    "temperature": 0.0, **extra}
            answer = client.post("/v1/chat/completions", json=body).json()
            assert answer["choices"][0]["finish_reason"] == "stop", answer
    return NUM_BENCH_REQUESTS + len(STOP_REQUESTS)


def _post_beacons(live) -> int:
    """One beacon per served request, timed the way a browser on loopback would see it."""
    records = [r for r in live.parts.obs.store.recent(1000) if r.ttft_ns is not None]
    with httpx.Client(base_url=live.base_url, timeout=10, trust_env=False) as client:
        for record in records:
            ttft_ms, e2e_ms = record.ttft_ns / 1e6, (record.end_ns - record.start_ns) / 1e6
            beacon = {"v": 1, "trace_id": record.trace_id, "outcome": "ok", "status": 200,
                      "token": live.parts.obs.beacon_signer.token(record.trace_id),
                      "url_path": "/v1/chat/completions", "chunks": record.num_output_tokens,
                      "sdk": "ttftscope-probe/0.1.0", "model": record.model,
                      # markInput() 5 ms before fetch; a fresh connection's DNS/TCP/TLS.
                      "input_ms": 5.0,
                      "resource": {"dns_ms": 0.1, "connect_ms": 0.3, "tls_ms": 0.0,
                                   "request_ms": ttft_ms, "response_ms": e2e_ms - ttft_ms},
                      "chunk_ms": [ttft_ms + 2.0 + 10.0 * i
                                   for i in range(min(record.num_output_tokens, 3))],
                      "t": {"start": 0, "headers": ttft_ms + 1.0, "first_byte": ttft_ms + 1.5,
                            "first_token": ttft_ms + 2.0, "first_paint": ttft_ms + 9.0,
                            "end": e2e_ms + 3.0}}
            response = client.post("/v1/probe", content=json.dumps(beacon),
                                   headers={"Content-Type": "text/plain;charset=UTF-8"})
            assert response.status_code == 202, response.text
    return len(records)


def _recording_rules() -> list[str]:
    groups = yaml.safe_load((DASHBOARDS / "prometheus/rules/recording.yml").read_text())["groups"]
    return [rule["record"] for group in groups for rule in group["rules"]]


def _settled(api: PrometheusAPI, num_requests: int, num_beacons: int) -> float | None:
    """An instant at which Prometheus holds the final counts and every recording rule has a
    value, or None: the load is then fully visible to queries evaluated at that instant."""
    at_s = time.time()
    checks = [('sum(llm_requests_total{job="engine"})', num_requests),
              ('sum(llm_probe_beacons_total{job="engine", outcome="accepted"})', num_beacons)]
    if any(finite_values(api.query(expr, at_s)) != [float(want)] for expr, want in checks):
        return None
    return at_s if all(finite_values(api.query(r, at_s)) for r in _recording_rules()) else None


@pytest.fixture(scope="module")
def stack(server_factory, tmp_path_factory):
    prometheus_bin = require_binary("prometheus", "prometheus")
    alertmanager_bin = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    live = server_factory()
    tmp = tmp_path_factory.mktemp("prometheus_live")
    engine = live.base_url.removeprefix("http://")
    with contextlib.ExitStack() as cleanup:
        receiver = alert_receiver(tmp)
        cleanup.callback(receiver.stop)
        receiver.start(timeout_s=30)
        rendered = _render_rules(tmp / "rendered", receiver.url + "/alerts")
        am = _alertmanager(alertmanager_bin, tmp, rendered)
        cleanup.callback(am.stop)
        am.start(timeout_s=30)
        prom = _prometheus(prometheus_bin, tmp, rendered, engine, f"127.0.0.1:{am.port}")
        cleanup.callback(prom.stop)
        prom.start(timeout_s=30)
        api = PrometheusAPI(prom.url)
        cleanup.callback(api.close)
        # Counters start at 0 in Prometheus before the first request: rates see all of it.
        wait_for(lambda: finite_values(api.query(
            f'up{{job="engine", device="cpu", instance="{engine}"}} == 1')), 30,
            "the first scrape of the engine")
        load_start_s = time.time()
        num_requests = _drive_load(live, tmp)
        num_beacons = _post_beacons(live)
        assert num_beacons == num_requests
        eval_at_s = wait_for(lambda: _settled(api, num_requests, num_beacons), 30,
                             "Prometheus to scrape the final counts and record every rule")
        yield Stack(live, api, receiver, yaml.safe_load((tmp / "alertmanager.yml").read_text()),
                    Endpoints(engine, prom.url, am.url), load_start_s,
                    eval_at_s, num_requests, num_beacons)


def _exported_gpu_metrics(live) -> set[str]:
    text = httpx.get(live.base_url + "/metrics", timeout=10, trust_env=False).text
    return set(re.findall(r"^(llm_gpu_\w+?)(?:\{| )", text, re.MULTILINE))


def _dashboard_queries() -> list[tuple[str, dict, str, str]]:
    out = []
    for path in sorted((DASHBOARDS / "generated").glob("*.json")):
        board = json.loads(path.read_text())
        # Prometheus queries only: the LogQL panels read Loki (checked by
        # tests/dashboards/test_schema_check.py with Grafana's LogQL grammar).
        out += [(path.name, board, panel["title"], target["expr"])
                for panel in board["panels"] for target in panel.get("targets", [])
                if (target.get("datasource") or panel["datasource"])["type"] == "prometheus"]
    return out


def _proxy_stages_only(expr: str) -> bool:
    """Every stage the query names is one only the proxy records."""
    named = [stage for matcher in re.findall(r'stage=~?"([^"]*)"', expr)
             for stage in matcher.split("|")]
    return bool(named) and all(stage in PROXY_ONLY_STAGES for stage in named)


def test_every_dashboard_query_returns_data(stack):
    api, live = stack.api, stack.live
    # The served model, and the catch-all every closed label set carries.
    assert api.label_values("model", "llm_requests_total") == sorted([live.model, OTHER])
    exported_gpu = _exported_gpu_metrics(live)
    queries = _dashboard_queries()
    assert len(queries) >= 40
    variables, failures, num_no_data = {}, [], 0
    for name, board, title, expr in queries:
        if name not in variables:
            variables[name] = resolve_variables(board, api, GRAFANA_BUILTINS)
        values = finite_values(api.query(substitute(expr, variables[name]), stack.eval_at_s))
        if COLLECTOR_FAMILIES.search(expr):
            continue      # evaluated without an error: all this stack can say of it
        unavailable = [m for m in re.findall(r"\bllm_gpu_\w+", expr) if m not in exported_gpu]
        reason = (NO_DATA_HERE["llm_gpu_"] if unavailable else
                  NO_DATA_HERE['stage="upstream_'] if _proxy_stages_only(expr) else None)
        if reason:   # NO_DATA_HERE: the listed reason must actually hold
            num_no_data += 1
            if values:
                failures.append(f"{name}: {title}: expected no data ({reason})")
        elif not values:
            failures.append(f"{name}: {title}: no data for {expr}")
    assert not failures, "\n".join(failures)
    # The three GPU panels' four queries and the proxy-only stages' stage-share queries.
    assert num_no_data <= 4 + len(PROXY_ONLY_STAGES)


def test_prefix_cache_hits_and_both_finish_reasons_reach_the_panels(stack):
    at_s, api = stack.eval_at_s, stack.api
    (ratio,) = finite_values(api.query(
        'sum(rate(llm_prompt_cached_tokens_total[1m])) / sum(rate(llm_prompt_tokens_total[1m]))',
        at_s))
    assert 0 < ratio < 1
    finished = {s["metric"]["finish_reason"]: float(s["value"][1]) for s in api.query(
        'sum by (finish_reason) (increase(llm_requests_total[5m]))', at_s)}
    assert finished["length"] > 0 and finished["stop"] > 0, finished
    (accepted,) = finite_values(api.query(
        'sum(llm_probe_beacons_total{outcome="accepted"})', at_s))
    assert accepted == stack.num_beacons


def test_every_recording_rule_has_data_and_every_rule_evaluates(stack):
    model, engine = stack.live.model, stack.endpoints.engine
    for record in _recording_rules():
        result = stack.api.query(record, stack.eval_at_s)
        assert {s["metric"]["instance"] for s in result} == {engine}, (record, result)
        models = [s["metric"].get("model", model) for s in result]
        assert set(models) <= {model, OTHER}, (record, result)   # `other` stays NaN: no traffic
        assert finite_values([s for s, m in zip(result, models) if m == model]), record
    groups = yaml.safe_load((DASHBOARDS / "prometheus/rules/alerts.yml").read_text())["groups"]
    alert_names = {rule["alert"] for group in groups for rule in group["rules"]}

    def all_evaluated() -> list[dict] | None:
        rules = stack.api.rules()
        return rules if all(r["health"] == "ok" for r in rules) else None
    rules = wait_for(all_evaluated, 20, "every rule to be evaluated without error")
    assert {r["name"] for r in rules} == set(_recording_rules()) | alert_names


def _firing_ttft_alerts(entries: list[dict]) -> list[dict]:
    return [a for a in entries if a["alertname"] == "LLMTTFTP95High" and a["status"] == "firing"]


def test_ttft_alert_fires_and_alertmanager_delivers_it_to_the_receiver(stack):
    def firing() -> list[dict]:
        return [a for a in stack.api.alerts()
                if a["labels"]["alertname"] == "LLMTTFTP95High" and a["state"] == "firing"]
    (alert,) = wait_for(firing, 60, "LLMTTFTP95High to fire in Prometheus")
    assert alert["labels"]["instance"] == stack.endpoints.engine
    assert alert["labels"]["model"] == stack.live.model
    assert alert["labels"]["severity"] == "page"
    assert float(alert["value"]) > TTFT_THRESHOLD_S

    # The receiver's GET / lists what Alertmanager posted, newest first.
    def delivered() -> list[dict]:
        listed = httpx.get(stack.receiver.url + "/", timeout=5, trust_env=False).json()
        return _firing_ttft_alerts(listed["alerts"])
    received = wait_for(delivered, 30, "Alertmanager to post a firing LLMTTFTP95High")
    committed = yaml.safe_load((DASHBOARDS / "alertmanager/alertmanager.yml").read_text())
    assert received[0]["receiver"] == committed["route"]["receiver"]
    assert received[0]["labels"]["instance"] == stack.endpoints.engine
    assert received[0]["annotations"]["dashboard"] == "/d/ttft-attribution"
    # ... and logged each as one JSON line on stdout (what Loki gets in compose).
    logged = [json.loads(line) for line in stack.receiver.log_path.read_text().splitlines()]
    assert _firing_ttft_alerts(logged), logged


def test_alertmanager_runs_the_committed_config_with_only_the_receiver_url_changed(stack):
    committed = yaml.safe_load((DASHBOARDS / "alertmanager/alertmanager.yml").read_text())
    expected = copy.deepcopy(committed)
    expected["route"].update(group_wait="1s", group_interval="2s")   # see _alertmanager
    for receiver in expected["receivers"]:
        for hook in receiver["webhook_configs"]:
            assert urlparse(hook["url"]).path == "/alerts"
            hook["url"] = stack.receiver.url + "/alerts"
    assert stack.alertmanager_config == expected
    loaded = httpx.get(stack.endpoints.alertmanager + "/api/v2/status", timeout=5,
                       trust_env=False).json()["config"]["original"]
    assert f"url: {stack.receiver.url}/alerts" in loaded


def _compose_healthcheck(service: str, port: int) -> subprocess.CompletedProcess:
    """docker-compose.yml's healthcheck command for `service`, aimed at a loopback port."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    kind, binary, *args = services[service]["healthcheck"]["test"]
    assert (kind, binary) == ("CMD", "python")     # what the python:*-slim images have
    args = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in args]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=30)


def test_compose_healthchecks_pass_against_the_running_services(stack):
    engine_port = int(stack.endpoints.engine.rsplit(":", 1)[1])
    result = _compose_healthcheck("engine", engine_port)
    assert result.returncode == 0, result.stderr
    assert _compose_healthcheck("alert-receiver", stack.receiver.port).returncode == 0
    # ... and fails where nothing answers, so the check is not vacuous.
    assert _compose_healthcheck("engine", free_port()).returncode != 0


def test_ttft_exemplars_name_traces_the_engine_served(stack):
    series = stack.api.exemplars("gen_ai_server_time_to_first_token_seconds_bucket",
                                 stack.load_start_s - 5, time.time() + 1)
    exemplars = [e for s in series for e in s["exemplars"]]
    assert exemplars, "no TTFT exemplars stored (is exemplar-storage on and the scrape OpenMetrics?)"
    for exemplar in exemplars:
        record = stack.live.parts.obs.store.get(exemplar["labels"]["trace_id"])
        assert record is not None, exemplar
        assert exemplar["labels"]["span_id"] == record.span_id
        assert math.isclose(float(exemplar["value"]), record.ttft_ns / 1e9, rel_tol=1e-9,
                            abs_tol=1e-9), (exemplar, record.ttft_ns)
    assert {s["seriesLabels"]["instance"] for s in series} == {stack.endpoints.engine}
