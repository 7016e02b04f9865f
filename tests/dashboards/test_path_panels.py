"""The whole path's waterfall (dashboards/path_panels.py), evaluated with real PromQL (promtool)
on known `llm_path_segment_seconds` data: network first, the backend's segments largest
first, backend_to_engine, the engine's stages in pipeline order, first_token; each bar
starts where the one before it ends, and a segment no trace had gets no bar."""
from __future__ import annotations

import sys
from fractions import Fraction

import yaml

from dashboards_support import (
    DASHBOARDS, dashboard, load_module, require_tool, run, substitute_grafana_vars,
)
from tracer.record.stages import PROXY_STAGE_LABELS, SERVER_STAGES

TITLE = "Whole path waterfall (collector, mean per trace that had the segment)"
PER_MINUTE = 64   # traces per minute: 64 * k/1024 s per minute, exact in binary


def _panel(title: str) -> dict:
    return next(p for p in dashboard("ttft-attribution.json")["panels"] if p["title"] == title)


def _series(part: str, segment: str, mean_s: Fraction, count: int = PER_MINUTE) -> list[dict]:
    labels = (f'model="smollm2", part="{part}", segment="{segment}", '
              'instance="collector:8000", job="collector"')
    return [{"series": f"llm_path_segment_seconds_sum{{{labels}}}",
             "values": f"0+{float(mean_s * count)!r}x10"},
            {"series": f"llm_path_segment_seconds_count{{{labels}}}",
             "values": f"0+{count}x10"}]


def test_the_whole_path_row_is_in_the_attribution_dashboard():
    panels = dashboard("ttft-attribution.json")["panels"]
    (row,) = [p for p in panels if p["type"] == "row"]
    assert row["title"] == "Whole path (collector)" and row["gridPos"]["w"] == 24
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    assert {p["title"] for p in below} == {
        TITLE, "Whole path share of client TTFT over time (collector)", "Collector health"}
    share = _panel("Whole path share of client TTFT over time (collector)")
    assert share["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "percent"
    # In path order, every part once: network, backend by segment, the call, engine, back.
    assert [t["legendFormat"] for t in share["targets"]] == [
        "network", "backend: {{segment}}", "backend_to_engine", "engine: {{segment}}",
        "first_token"]
    health = " ".join(t["expr"] for t in _panel("Collector health")["targets"])
    for family in ("llm_collector_traces_total", "llm_collector_spans_total",
                   "llm_collector_pending_traces", "llm_beacon_relay_total"):
        assert family in health


def test_whole_path_bars_start_where_the_previous_segment_ends(tmp_path):
    promtool = require_tool("promtool", "prometheus")
    # build.py puts dashboards/ on the path its modules import each other by.
    load_module(DASHBOARDS / "build.py", "ttftscope_dashboards_build")
    path_panels, ttft = sys.modules["path_panels"], sys.modules["ttft_attribution"]
    engine_order = tuple(s for s, _ in ttft.stage_order(SERVER_STAGES, PROXY_STAGE_LABELS))
    orders = {(part, segment): order
              for part, segment, order in path_panels.path_order(engine_order)}
    k = lambda n: Fraction(n, 1024)  # noqa: E731
    # In path order, as the waterfall must draw them. A backend span named `queue` stays
    # apart from the engine's queue; the backend's rows come largest first.
    expected = [
        ("network", "network", "network", k(2), orders["network", "network"]),
        ("backend", "retrieve", "backend: retrieve", k(512), "02.01"),
        ("backend", "SELECT docs", "backend: SELECT docs", k(256), "02.02"),
        ("backend", "queue", "backend: queue", k(3), "02.03"),
        ("network", "backend_to_engine", "backend_to_engine", k(1),
         orders["network", "backend_to_engine"]),
        ("engine", "queue", "engine: queue", k(64), orders["engine", "queue"]),
        ("engine", "prefill", "engine: prefill", k(128), orders["engine", "prefill"]),
        ("network", "first_token", "first_token", k(4), orders["network", "first_token"]),
    ]
    assert [e[4] for e in expected] == sorted((e[4] for e in expected), key=float)
    series = [s for part, segment, _, mean_s, _ in expected
              for s in _series(part, segment, mean_s)]
    # Exported but never observed (the collector creates them at zero): no bar, and no NaN
    # in the sums after them.
    series += _series("backend", "other", k(0), count=0)
    series += _series("engine", "tokenize", k(0), count=0)
    offset_q, mean_q = (substitute_grafana_vars(t["expr"]) for t in _panel(TITLE)["targets"])
    starts, start = [], Fraction(0)
    for _, _, stage, mean_s, order in expected:
        starts.append({"labels": f'{{stage="{stage}", order="{order}"}}', "value": float(start)})
        start += mean_s
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": offset_q, "eval_time": "10m", "exp_samples": starts},
            {"expr": mean_q, "eval_time": "10m", "exp_samples": [
                {"labels": f'{{stage="{stage}"}}', "value": float(m)}
                for _, _, stage, m, _ in expected]},
        ]}]}
    path = tmp_path / "path_waterfall_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = run([promtool, "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    # The last bar ends at the mean client TTFT: every segment was in every trace here.
    assert starts[-1]["value"] + float(expected[-1][3]) == float(sum(e[3] for e in expected))
