"""The real promtool and amtool accept the configs, and the alert unit tests pass (and can fail)."""
from __future__ import annotations

import yaml

from dashboards_support import (
    DASHBOARDS, PROMETHEUS_DIR, load_yaml, python, require_tool, run,
)

RENDER_RULES = PROMETHEUS_DIR / "render_rules.py"
TTFT_BUCKET = ('gen_ai_server_time_to_first_token_seconds_bucket{{le="{le}", '
               'gen_ai_request_model="smollm2", gen_ai_operation_name="chat", '
               'instance="engine:8000", job="engine"}}')


def test_prometheus_config_and_its_rule_files_are_valid():
    promtool = require_tool("promtool", "prometheus")
    result = run([promtool, "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout


def test_rule_files_are_valid():
    promtool = require_tool("promtool", "prometheus")
    rule_files = sorted(str(p) for p in (PROMETHEUS_DIR / "rules").glob("*.yml"))
    assert len(rule_files) == 2
    result = run([promtool, "check", "rules", *rule_files])
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass():
    promtool = require_tool("promtool", "prometheus")
    tests = sorted(str(p) for p in (PROMETHEUS_DIR / "tests").glob("*.yml"))
    assert len(tests) >= 2
    result = run([promtool, "test", "rules", *tests])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


def test_rule_unit_tests_fail_against_a_lower_threshold(tmp_path):
    """The committed unit tests pin the threshold: with 0.3 s the fast case (p95 0.4875 s) pages."""
    promtool = require_tool("promtool", "prometheus")
    rendered = python(str(RENDER_RULES), "--ttft-threshold-s", "0.3", "--out-dir", str(tmp_path))
    assert rendered.returncode == 0, rendered.stderr
    unit = load_yaml(PROMETHEUS_DIR / "tests" / "alerts_test.yml")
    unit["rule_files"] = [str(PROMETHEUS_DIR / "rules" / "recording.yml"),
                          str(tmp_path / "alerts.yml")]
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = run([promtool, "test", "rules", str(path)])
    assert result.returncode != 0
    assert "alertname: LLMTTFTP95High, time: 15m" in result.stdout + result.stderr


def test_low_threshold_render_fires_after_its_for_duration(tmp_path):
    """What the live test relies on: --ttft-threshold-s 0.05 --for 1m pages on a 0.24 s p95."""
    promtool = require_tool("promtool", "prometheus")
    rendered = python(str(RENDER_RULES), "--ttft-threshold-s", "0.05", "--for", "1m",
                      "--out-dir", str(tmp_path))
    assert rendered.returncode == 0, rendered.stderr
    # TTFT in (0.1, 0.25]: p95 = 0.1 + 0.15 * 0.95 = 0.2425 s; first rate at 1m.
    series = [{"series": TTFT_BUCKET.format(le=le), "values": values} for le, values in
              (("0.1", "0+0x5"), ("0.25", "0+60x5"), ("+Inf", "0+60x5"))]
    alert = ('ALERTS{alertname="LLMTTFTP95High", instance="engine:8000", model="smollm2", '
             'severity="page", alertstate="%s"}')
    unit = {
        "rule_files": [str(PROMETHEUS_DIR / "rules" / "recording.yml"),
                       str(tmp_path / "alerts.yml")],
        "evaluation_interval": "1m",
        "group_eval_order": ["ttftscope-recording", "ttftscope-alerts"],
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": "ALERTS", "eval_time": "1m",
             "exp_samples": [{"labels": alert % "pending", "value": 1}]},
            {"expr": "ALERTS", "eval_time": "2m",
             "exp_samples": [{"labels": alert % "firing", "value": 1}]},
        ]}]}
    path = tmp_path / "live_threshold_test.yml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = run([promtool, "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_is_valid_and_posts_to_the_webhook():
    amtool = require_tool("amtool", "prometheus-alertmanager")
    path = DASHBOARDS / "alertmanager" / "alertmanager.yml"
    result = run([amtool, "check-config", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_yaml(path)
    receiver = next(r for r in config["receivers"] if r["name"] == config["route"]["receiver"])
    assert receiver["webhook_configs"][0]["url"].startswith("http")


def test_rendered_alertmanager_config_with_another_webhook_is_valid(tmp_path):
    amtool = require_tool("amtool", "prometheus-alertmanager")
    url = "http://127.0.0.1:18080/alerts"
    rendered = python(str(RENDER_RULES), "--webhook-url", url, "--out-dir", str(tmp_path))
    assert rendered.returncode == 0, rendered.stderr
    result = run([amtool, "check-config", str(tmp_path / "alertmanager.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    (receiver,) = load_yaml(tmp_path / "alertmanager.yml")["receivers"]
    assert receiver["webhook_configs"][0]["url"] == url
