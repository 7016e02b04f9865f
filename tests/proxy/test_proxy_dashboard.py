"""The TTFT waterfall shows the proxy's five stages when its instance is selected, with real
PromQL (promtool) over a proxy and an engine scraped side by side."""
from __future__ import annotations

import json
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from tracer.record.stages import PROXY_STAGES, SERVER_STAGES

GENERATED = Path(__file__).resolve().parents[2] / "dashboards" / "generated"
PROXY, ENGINE = "proxy:8100", "engine:8000"
PER_MINUTE = 64   # requests per minute: means in 1/1024 s stay exact in binary


def waterfall_queries(instance: str) -> tuple[str, str]:
    board = json.loads((GENERATED / "ttft-attribution.json").read_text())
    # the server stages' waterfall (the whole path's is tests/dashboards/test_path_panels.py)
    (panel,) = [p for p in board["panels"] if p["type"] == "barchart"
                and p["title"].startswith("Attribution waterfall")]
    grafana = {"$__rate_interval": "1m", "$__range": "10m", "$model": ".*",
               "$instance": instance}
    exprs = []
    for target in panel["targets"]:
        expr = target["expr"]
        for var, value in grafana.items():
            expr = expr.replace(var, value)
        exprs.append(expr)
    return exprs[0], exprs[1]


def stage_series(instance: str, means: dict[str, Fraction]) -> list[dict]:
    series = []
    for stage, mean_s in means.items():
        labels = f'stage="{stage}", instance="{instance}", job="{instance.split(":")[0]}"'
        series += [
            {"series": f"llm_request_stage_duration_seconds_sum{{{labels}}}",
             "values": f"0+{float(mean_s * PER_MINUTE)!r}x10"},
            {"series": f"llm_request_stage_duration_seconds_count{{{labels}}}",
             "values": f"0+{PER_MINUTE}x10"}]
    return series


@pytest.mark.parametrize("instance,stages", [(PROXY, PROXY_STAGES), (ENGINE, SERVER_STAGES)])
def test_the_waterfall_draws_the_selected_instance_stage_set(tmp_path, instance, stages):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("`promtool` is not installed: apt-get install -y prometheus")
    proxy_means = dict(zip(PROXY_STAGES, (Fraction(k, 1024) for k in (1, 2, 300, 40, 1))))
    engine_means = dict(zip(SERVER_STAGES, (Fraction(k, 1024) for k in (2, 1, 3, 0, 64, 200,
                                                                          1, 2, 1))))
    means = proxy_means if instance == PROXY else engine_means
    offset_q, mean_q = waterfall_queries(instance)
    starts, start = [], Fraction(0)
    for stage in stages:
        starts.append({"stage": stage, "value": float(start)})
        start += means[stage]
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": stage_series(PROXY, proxy_means) + stage_series(ENGINE, engine_means),
        "promql_expr_test": [
            {"expr": f"label_replace({offset_q}, \"order\", \"\", \"\", \"\")",
             "eval_time": "10m",
             "exp_samples": [{"labels": f'{{stage="{s["stage"]}"}}', "value": s["value"]}
                             for s in starts]},
            {"expr": mean_q, "eval_time": "10m", "exp_samples": [
                {"labels": f'{{stage="{s}"}}', "value": float(means[s])} for s in stages]},
        ]}]}
    path = tmp_path / "waterfall_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_order_labels_put_the_proxy_stages_in_its_pipeline_order():
    offset_q, _ = waterfall_queries(".*")
    orders = {}
    for stage in (*SERVER_STAGES, *PROXY_STAGES):
        marker = f'"stage", "{stage}", "", ""), "order", "'
        orders[stage] = float(offset_q.split(marker)[1].split('"')[0])
    assert sorted(PROXY_STAGES, key=orders.get) == list(PROXY_STAGES)
    assert sorted(SERVER_STAGES, key=orders.get) == list(SERVER_STAGES)
