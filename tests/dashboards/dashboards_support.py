"""Helpers for the dashboards tests: file access, a small PromQL scanner, the metric catalogue.

The catalogue is the real one: the series tracer/sinks/metrics.py, tracer/sinks/engine_steps.py,
tracer/sinks/gpu.py and the collector's tracer/sinks/path_metrics.py export, with their label
names, plus the recording rules; so a renamed metric or label breaks the tests.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
PROMETHEUS_DIR = DASHBOARDS / "prometheus"
# Labels Prometheus itself attaches to every scraped series (prometheus.yml adds `device`).
TARGET_LABELS = {"instance", "job", "device"}
# What Grafana substitutes for its variables when it runs a query.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "10m", "$model": ".*",
                "$instance": ".*"}


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def dashboard(name: str) -> dict:
    return json.loads((DASHBOARDS / "generated" / name).read_text())


def dashboard_names() -> list[str]:
    return sorted(p.name for p in (DASHBOARDS / "generated").glob("*.json"))


def query_language(panel: dict, target: dict) -> str:
    """The data source type a target queries: prometheus (PromQL), loki (LogQL), tempo."""
    return (target.get("datasource") or panel.get("datasource") or {})["type"]


def panel_queries(board: dict, language: str = "prometheus") -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel on `language`'s data source."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])
            if query_language(p, t) == language]


def rule_exprs() -> list[tuple[str, str]]:
    """(rule name, expr) of every recording and alerting rule."""
    out = []
    for path in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for group in load_yaml(path)["groups"]:
            out += [(r.get("record") or r["alert"], r["expr"]) for r in group["rules"]]
    return out


def recording_rule_names() -> set[str]:
    rules = load_yaml(PROMETHEUS_DIR / "rules" / "recording.yml")["groups"]
    return {r["record"] for g in rules for r in g["rules"]}


def substitute_grafana_vars(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# `*+` is possessive: without it "rate(" would backtrack to the identifier "rat".
_IDENT = re.compile(r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*+(?!\s*\()")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan", "Inf", "NaN", "le"}


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """Every `metric{...}` in `expr`: (metric, {label: (operator, value)})."""
    return [(m.group(1) or "", {lm.group(1): (lm.group(2), lm.group(3))
                                for lm in _MATCHER.finditer(m.group(2))})
            for m in _SELECTOR.finditer(expr)]


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` reads, with or without a `{...}` selector."""
    named = {metric for metric, _ in selectors(expr) if metric}
    rest = _SELECTOR.sub(" ", expr)
    for pattern in (_STRING, _RANGE, _GROUPING):
        rest = pattern.sub(" ", rest)
    return named | {w for w in _IDENT.findall(rest) if w not in _KEYWORDS}


def known_series() -> dict[str, set[str]]:
    """Series name -> label names, from the tracer's real registry (the engine's step
    histograms and the collector's whole-path metrics included) and GPU collector."""
    from prometheus_client import CollectorRegistry

    from tracer.sinks.engine_steps import EngineStepMetrics
    from tracer.sinks.gpu import GPU_METRICS
    from tracer.sinks.metrics import LLMMetrics
    from tracer.sinks.path_metrics import BEACON_RELAY, PathMetrics
    from tracer.web.otlp_forward import OtlpForwarder

    registry = CollectorRegistry()
    metrics = LLMMetrics(registry, model_names=["smollm2"])
    EngineStepMetrics(registry, "smollm2")
    # The collector's (tracer/collect/app.py): the whole path and its beacon relay.
    PathMetrics(registry, metrics.models)
    OtlpForwarder("http://127.0.0.1:4318/v1/traces", registry, metric=BEACON_RELAY)
    series: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    for name, _help in GPU_METRICS:
        series[name] = {"gpu"}
    return series


def require_tool(name: str, package: str) -> str:
    """The path of a CLI the tests need; a missing one is a failure that names its package."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not installed: apt-get install -y {package} (Debian package "
                    f"{package}; `make install` does it)")
    return path


def run(args: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def python(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, *args])


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
