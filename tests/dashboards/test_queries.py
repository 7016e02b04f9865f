"""Every dashboard and rule query reads real metrics with real labels, filters by the dashboard
variables, and is valid PromQL; the waterfall stacks the nine stages in pipeline order."""
from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from dashboards_support import (
    DASHBOARDS, TARGET_LABELS, dashboard, dashboard_names, known_series,
    load_module, load_yaml, metric_names, panel_queries, recording_rule_names, require_tool,
    rule_exprs, run, selectors, substitute_grafana_vars,
)
from tracer.record.stages import SERVER_STAGES

MODEL_LABELS = {"model", "gen_ai_request_model"}
# Labels the recording rules keep (recording.yml): instance, model, stage, cause, kind.
RECORDED_LABELS = {"instance", "model", "stage", "cause", "kind"}


@pytest.fixture(scope="module")
def series() -> dict[str, set[str]]:
    return known_series()


def all_queries() -> list[tuple[str, str]]:
    out = [(f"{name}: {title}", expr) for name in dashboard_names()
           for title, expr in panel_queries(dashboard(name))]
    return out + [(f"rule {name}", expr) for name, expr in rule_exprs()]


def test_both_dashboards_are_generated():
    assert dashboard_names() == ["engine.json", "ttft-attribution.json"]


def test_every_query_reads_only_exported_or_recorded_metrics(series):
    allowed = set(series) | recording_rule_names()
    unknown = {(where, name) for where, expr in all_queries()
               for name in metric_names(expr) if name not in allowed}
    assert not unknown
    read = {name for _, expr in all_queries() for name in metric_names(expr)}
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in read   # the scan finds names
    assert "llm:ttft_seconds:p95_5m" in read


def test_every_matcher_names_a_label_the_metric_has(series):
    recorded = recording_rule_names()
    for where, expr in all_queries():
        for metric, matchers in selectors(expr):
            labels = RECORDED_LABELS if metric in recorded else series[metric] | TARGET_LABELS
            assert set(matchers) <= labels, (where, metric, set(matchers) - labels)


@pytest.mark.parametrize("name", ["engine.json", "ttft-attribution.json"])
def test_every_selector_filters_by_the_dashboard_variables(name, series):
    board = dashboard(name)
    assert [v["name"] for v in board["templating"]["list"]] == ["model", "instance"]
    checked = 0
    for title, expr in panel_queries(board):
        found = selectors(expr)
        assert found, (title, expr)
        for metric, matchers in found:
            assert matchers.get("instance") == ("=~", "$instance"), (title, metric)
            labels = RECORDED_LABELS if ":" in metric else series[metric]
            for label in labels & MODEL_LABELS:
                assert matchers.get(label) == ("=~", "$model"), (title, metric)
                checked += 1
    assert checked > 0


def test_every_panel_says_what_it_means_and_what_to_do():
    for name in dashboard_names():
        # A row is a title over the panels below it; Grafana's RowPanel has no description.
        for panel in dashboard(name)["panels"]:
            if panel["type"] != "row":
                assert len(panel.get("description") or "") > 80, (name, panel["title"])


def test_panel_ids_are_unique_and_panels_do_not_overlap():
    for name in dashboard_names():
        panels = dashboard(name)["panels"]
        assert len({p["id"] for p in panels}) == len(panels)
        cells = set()
        for p in panels:
            pos = p["gridPos"]
            assert pos["x"] + pos["w"] <= 24
            area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                    for y in range(pos["y"], pos["y"] + pos["h"])}
            assert not cells & area, (name, p["title"])
            cells |= area


def test_all_queries_are_valid_promql(tmp_path):
    promtool = require_tool("promtool", "prometheus")
    rules = [{"record": f"dashboard:query_{i}", "expr": substitute_grafana_vars(expr)}
             for i, (_, expr) in enumerate(all_queries())]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_ttft_panel_has_exemplars_and_the_alert_threshold_line():
    thresholds = load_module(DASHBOARDS / "thresholds.py", "ttftscope_thresholds")
    panel = dashboard("ttft-attribution.json")["panels"][0]
    assert panel["id"] == 1 and panel["type"] == "timeseries"
    exprs = [t["expr"] for t in panel["targets"]]
    assert all(t["exemplar"] is True for t in panel["targets"])
    assert sum("gen_ai_server_time_to_first_token_seconds_bucket" in e for e in exprs) == 4
    assert [e.split(",")[0] for e in exprs[:4]] == [
        f"histogram_quantile({q}" for q in ("0.5", "0.95", "0.99", "0.999")]
    assert "llm_client_time_to_first_token_seconds_bucket" in exprs[4]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == thresholds.DEFAULT_THRESHOLDS.ttft_p95_s
    style = panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"]
    assert style in {"line", "dashed"}


def test_each_alert_is_defined_once_in_prometheus_and_links_its_dashboard():
    # One source of alerts: Prometheus rules routed by Alertmanager. A Grafana-managed copy
    # would fire twice, through a second notification path.
    assert not (DASHBOARDS / "grafana/provisioning/alerting").exists()
    alerts = [r for path in sorted((DASHBOARDS / "prometheus/rules").glob("*.yml"))
              for g in load_yaml(path)["groups"] for r in g["rules"] if "alert" in r]
    names = [r["alert"] for r in alerts]
    assert "LLMTTFTP95High" in names and len(names) == len(set(names)), names
    boards = {dashboard(name)["uid"] for name in dashboard_names()}
    for rule in alerts:
        assert rule["annotations"]["dashboard"].removeprefix("/d/") in boards, rule["alert"]


def waterfall() -> dict:
    return next(p for p in dashboard("ttft-attribution.json")["panels"]
                if p["type"] == "barchart")


def test_waterfall_is_a_horizontal_stack_sorted_by_pipeline_order():
    panel = waterfall()
    assert panel["options"]["orientation"] == "horizontal"
    assert panel["options"]["stacking"] == "normal"
    assert panel["options"]["xField"] == "stage"
    ids = [t["id"] for t in panel["transformations"]]
    assert ids.index("joinByField") < ids.index("sortBy") < ids.index("organize")
    join, sort, organize = (next(t for t in panel["transformations"] if t["id"] == i)
                            for i in ("joinByField", "sortBy", "organize"))
    assert join["options"]["byField"] == "stage"
    assert sort["options"]["sort"] == [{"field": "order", "desc": False}]
    offset_name = organize["options"]["renameByName"]["Value #A"]
    (override,) = [o for o in panel["fieldConfig"]["overrides"]
                   if o["matcher"]["options"] == offset_name]
    color = next(p["value"] for p in override["properties"] if p["id"] == "color")
    assert color["fixedColor"] == "transparent"   # the offset bar is invisible


def test_waterfall_bars_start_where_the_previous_stage_ends(tmp_path):
    """Evaluate the waterfall's two queries with real PromQL (promtool) on known stage data."""
    promtool = require_tool("promtool", "prometheus")
    # Means in 1/1024 s: exact in binary, so promtool's exact comparison holds. kv_lookup is
    # 0 s on purpose: its bar starts where tokenize's ends and queue starts at the same place.
    means = dict(zip(SERVER_STAGES, (Fraction(k, 1024) for k in (2, 1, 3, 0, 512, 256, 1, 2, 1))))
    per_minute = 64  # requests per minute: 64 * k/1024 = k/16 s of stage time, exact too
    series = []
    for stage, mean_s in means.items():
        labels = f'stage="{stage}", instance="engine:8000", job="engine"'
        series += [
            {"series": f"llm_request_stage_duration_seconds_sum{{{labels}}}",
             "values": f"0+{float(mean_s * per_minute)!r}x10"},
            {"series": f"llm_request_stage_duration_seconds_count{{{labels}}}",
             "values": f"0+{per_minute}x10"}]
    offset_q, mean_q = (substitute_grafana_vars(t["expr"]) for t in waterfall()["targets"])
    starts, start = [], Fraction(0)
    for i, (stage, mean_s) in enumerate(means.items()):
        labels = f'{{stage="{stage}", order="{i + 1:02d}"}}'
        starts.append({"labels": labels, "value": float(start)})
        start += mean_s
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": offset_q, "eval_time": "10m", "exp_samples": starts},
            {"expr": mean_q, "eval_time": "10m", "exp_samples": [
                {"labels": f'{{stage="{s}"}}', "value": float(m)} for s, m in means.items()]},
        ]}]}
    path = tmp_path / "waterfall_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = run([promtool, "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    # The last bar ends at the mean server TTFT: the sum of the nine means.
    assert starts[-1]["value"] + float(means["send"]) == float(sum(means.values()))
