"""The generated dashboards type-check against Grafana's published schema (@grafana/schema,
tsc --strict) and their LogQL parses with Grafana's own grammar (@grafana/lezer-logql);
a field or query Grafana would reject fails the check (dashboards/schema_check/check.mjs)."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from dashboards_support import DASHBOARDS, dashboard, dashboard_names, run

SCHEMA_CHECK = DASHBOARDS / "schema_check"


def check(paths: list[Path]):
    node = shutil.which("node")
    if node is None or not (SCHEMA_CHECK / "node_modules" / "typescript").exists():
        pytest.fail("the schema check needs node and `npm ci` in dashboards/schema_check "
                    "(`make install` does it)")
    return run([node, str(SCHEMA_CHECK / "check.mjs"), *map(str, paths)], cwd=SCHEMA_CHECK)


def test_generated_dashboards_match_grafanas_schema():
    result = check([DASHBOARDS / "generated" / name for name in dashboard_names()])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok: {len(dashboard_names())} dashboards" in result.stdout


def _write(tmp_path: Path, board: dict) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(board))
    return path


def _panel(board: dict, panel_type: str) -> dict:
    return next(p for p in board["panels"] if p["type"] == panel_type)


@pytest.mark.parametrize("mutation, expected", [
    # An option the time series plugin does not have.
    (lambda b: _panel(b, "timeseries")["options"].update(legendd={}), "legendd"),
    # A known option with a value outside its enum.
    (lambda b: _panel(b, "timeseries")["options"]["tooltip"].update(mode="sometimes"),
     "sometimes"),
    # A required heatmap option removed.
    (lambda b: _panel(b, "heatmap")["options"].pop("yAxis"), "yAxis"),
    # A misspelt field in a Prometheus query.
    (lambda b: _panel(b, "timeseries")["targets"][0].update(legend_format="x"), "legend_format"),
    # A misspelt top-level dashboard field.
    (lambda b: b.update(schemaVersionn=39), "schemaVersionn"),
])
def test_a_field_grafana_would_reject_fails_the_check(tmp_path, mutation, expected):
    board = copy.deepcopy(dashboard("ttft-attribution.json"))
    mutation(board)
    result = check([_write(tmp_path, board)])
    assert result.returncode == 1
    assert expected in result.stdout + result.stderr


def test_a_logql_syntax_error_fails_the_check(tmp_path):
    board = copy.deepcopy(dashboard("ttft-attribution.json"))
    target = _panel(board, "xychart")["targets"][0]
    assert "| tpot_ms > 0" in target["expr"]
    target["expr"] = target["expr"].replace("| tpot_ms > 0", "| tpot_ms >", 1)
    result = check([_write(tmp_path, board)])
    assert result.returncode == 1
    assert "logql syntax error" in result.stderr


def test_every_loki_panel_is_checked():
    """The check parses what the dashboards hold: LogQL panels exist and have queries."""
    loki = [t["expr"] for name in dashboard_names() for p in dashboard(name)["panels"]
            for t in p.get("targets", []) if (t.get("datasource") or {}).get("type") == "loki"]
    assert len(loki) >= 2
