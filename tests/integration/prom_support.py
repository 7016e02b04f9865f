"""Helpers for the live Prometheus + Alertmanager test: daemons on loopback, their configs built
from dashboards/, the stack's alert receiver, the HTTP API, and Grafana's variable substitution.

Every wait is a poll of a real condition with a deadline; every daemon is stopped even when
the test fails.
"""
from __future__ import annotations

import copy
import enum
import math
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
POLL_INTERVAL_S = 0.25
T = TypeVar("T")


def require_binary(name: str, package: str) -> str:
    """The path of a daemon the test needs; a missing one fails the test, naming its package."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not installed: apt-get install -y {package} "
                    f"(Debian package {package}; `make install` does it)")
    return path


def wait_for(condition: Callable[[], T], timeout_s: float, what: str) -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout_s`."""
    deadline_s, wake = time.monotonic() + timeout_s, threading.Event()
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; "
                                 f"last: {result!r}")
        wake.wait(POLL_INTERVAL_S)


def free_port() -> int:
    # A daemon cannot report a port 0 binding back; a rare race is caught by Daemon.start.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DaemonStatus(enum.Enum):
    NOT_STARTED = "not_started"
    READY = "ready"
    STOPPED = "stopped"


class Daemon:
    """A server binary on a free loopback port, its output in a log file, stopped for sure.

    For example::

        am = Daemon("alertmanager", lambda port: ["/usr/bin/prometheus-alertmanager",
                    f"--web.listen-address=127.0.0.1:{port}"], log_dir=Path("/tmp"))
        am.start(timeout_s=20)
        am.url          # 'http://127.0.0.1:40123'
        am.stop()
    """

    def __init__(self, name: str, make_args: Callable[[int], list[str]], log_dir: Path,
                 ready_path: str = "/-/ready") -> None:
        self.name, self._make_args, self._ready_path = name, make_args, ready_path
        self.log_path = log_dir / f"{name}.log"
        self.port: int | None = None
        self.status = DaemonStatus.NOT_STARTED
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float, attempts: int = 3) -> None:
        """Start on a free port and wait for its readiness endpoint; a port taken between
        picking and binding makes the daemon exit, and it is retried on another."""
        for _ in range(attempts):
            self.port = free_port()
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(self._make_args(self.port), stdout=log,
                                              stderr=subprocess.STDOUT, cwd=self.log_path.parent)
            if wait_for(self._ready_or_exited, timeout_s, f"{self.name} to be ready") == "ready":
                self.status = DaemonStatus.READY
                return
        raise AssertionError(f"{self.name} exited before it was ready:\n{self.log_tail()}")

    def _ready_or_exited(self) -> str | None:
        if self._proc.poll() is not None:
            return "exited"
        try:
            response = httpx.get(self.url + self._ready_path, timeout=2.0, trust_env=False)
        except httpx.HTTPError:
            return None
        return "ready" if response.status_code == 200 else None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout_s)
        self.status = DaemonStatus.STOPPED

    def log_tail(self, num_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:] if self.log_path.exists() else ""


ALERT_RECEIVER = DASHBOARDS / "alert_receiver" / "receiver.py"


def alert_receiver(log_dir: Path) -> Daemon:
    """The compose stack's alert-receiver (dashboards/alert_receiver/receiver.py), the same
    script on a loopback port: Alertmanager posts to `<url>/alerts`, GET `<url>/` lists what
    arrived, and its stdout (the JSON line per alert) is `log_path`."""
    return Daemon("alert-receiver", lambda port: [
        sys.executable, str(ALERT_RECEIVER), "--host", "127.0.0.1", "--port", str(port)],
        log_dir=log_dir)


class PrometheusAPI:
    """The few /api/v1 calls the test makes; each returns `data` of a successful answer.

    For example::

        PrometheusAPI("http://127.0.0.1:9090").query("up")
        # [{'metric': {'__name__': 'up', ...}, 'value': [1700000000.0, '1']}]
    """

    def __init__(self, base_url: str) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=10.0, trust_env=False)

    def _get(self, path: str, **params):
        response = self._client.get(path, params=params)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str, at_s: float | None = None) -> list[dict]:
        """POSTed, as Grafana sends a long query (the whole path's waterfall is ~50 KB)."""
        params = {"query": expr} if at_s is None else {"query": expr, "time": f"{at_s:.3f}"}
        response = self._client.post("/api/v1/query", data=params)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (expr[:200], body)
        return body["data"]["result"]

    def alerts(self) -> list[dict]:
        return self._get("/api/v1/alerts")["alerts"]

    def rules(self) -> list[dict]:
        return [rule for group in self._get("/api/v1/rules")["groups"] for rule in group["rules"]]

    def exemplars(self, expr: str, start_s: float, end_s: float) -> list[dict]:
        return self._get("/api/v1/query_exemplars", query=expr, start=f"{start_s:.3f}",
                         end=f"{end_s:.3f}")

    def label_values(self, label: str, match: str | None) -> list[str]:
        params = {} if match is None else {"match[]": match}
        return self._get(f"/api/v1/label/{label}/values", **params)

    def close(self) -> None:
        self._client.close()


def finite_values(result: list[dict]) -> list[float]:
    """The finite sample values of an instant-vector (or scalar) query result."""
    values = [float(sample["value"][1]) for sample in result]
    return [v for v in values if math.isfinite(v)]


@dataclass(slots=True, frozen=True)
class Endpoints:
    """Where the loopback stack listens, keyed the way the compose hostnames are mapped."""

    engine: str          # host:port
    prometheus: str
    alertmanager: str


# compose services behind a profile (`gpu`, `proxy`): prometheus.yml finds them by DNS;
# nothing runs them here, so their discovery is dropped (compose's DNS would yield no target).
PROFILE_SERVICES = {"engine-gpu", "proxy", "engine-a", "engine-b",
                    "collector-0", "collector-1"}   # the scaleout profile's collectors


# Always-on compose services this test does not start: the standalone beacon collector has
# tests of its own (tests/collect/); here the engine joins the beacons in-process.
UNSTARTED_JOBS = frozenset({"collector"})


def prometheus_config(repo_config: dict, endpoints: Endpoints, interval: str) -> dict:
    """The repository's prometheus.yml for this machine: compose hostnames become loopback
    ports, every interval becomes `interval`; jobs, labels, relabelling and rule files stay as
    they are. A job left with no target (a profile's) is dropped."""
    targets = {"engine:8000": endpoints.engine, "localhost:9090": endpoints.prometheus,
               "alertmanager:9093": endpoints.alertmanager}
    config = copy.deepcopy(repo_config)
    config["global"].update(scrape_interval=interval, evaluation_interval=interval)
    for manager in config["alerting"]["alertmanagers"]:
        manager["static_configs"] = _retarget(manager["static_configs"], targets)
    jobs = []
    for job in config["scrape_configs"]:
        if "scrape_interval" in job:
            job["scrape_interval"] = interval
        discovered = {n for sd in job.pop("dns_sd_configs", []) for n in sd["names"]}
        assert discovered <= PROFILE_SERVICES, f"DNS names this test cannot map: {discovered}"
        if job["job_name"] in UNSTARTED_JOBS:
            continue
        if job.get("static_configs"):
            job["static_configs"] = _retarget(job["static_configs"], targets)
            jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def _retarget(static_configs: list[dict], targets: dict[str, str]) -> list[dict]:
    out = []
    for static in static_configs:
        unknown = set(static["targets"]) - set(targets)
        assert not unknown, f"prometheus.yml has targets this test cannot map: {unknown}"
        out.append({**static, "targets": [targets[t] for t in static["targets"]]})
    return out


def alertmanager_config(rendered: dict, group_wait: str, group_interval: str) -> dict:
    """The rendered alertmanager.yml with grouping timings short enough for a test."""
    config = copy.deepcopy(rendered)
    config["route"].update(group_wait=group_wait, group_interval=group_interval)
    return config


_SPECIAL = re.compile(r"([$^*{}\[\]'+?.()|])")
_LABEL_VALUES = re.compile(r"label_values\((?:(.+),\s*)?(\w+)\)\s*")


def grafana_regex(values: list[str]) -> str:
    """What Grafana puts in a Prometheus query for a multi-value variable: `(a|b)`, regex
    characters escaped with a PromQL-string-escaped backslash (prometheusSpecialRegexEscape)."""
    escaped = [_SPECIAL.sub(r"\\\\\1", v.replace("\\", "\\\\\\\\")) for v in values]
    return "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace `$name` variables, longest name first (`$__range_s` before `$__range`)."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(f"${name}", variables[name])
    # `$1` is label_replace's group reference, which Grafana leaves alone (no variable is
    # named by digits); any other `$` is a variable nobody substituted.
    assert not re.search(r"\$(?!\d)", expr), f"a template variable is left in: {expr}"
    return expr


def resolve_variables(board: dict, api: PrometheusAPI, builtins: dict[str, str]) -> dict:
    """Each dashboard variable's values as Grafana would list them (`label_values(...)`,
    through the real Prometheus), as the regex a user selecting them all would send."""
    variables = dict(builtins)
    for var in board["templating"]["list"]:
        match = _LABEL_VALUES.fullmatch(var["query"])
        assert match, f"variable {var['name']}: not a label_values() query: {var['query']}"
        selector = None if match.group(1) is None else substitute(match.group(1), variables)
        values = api.label_values(match.group(2), selector)
        assert values, f"variable {var['name']} lists no values ({var['query']})"
        variables[var["name"]] = grafana_regex(values)
    return variables
