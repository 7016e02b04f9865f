"""The committed generated files match their generators, and the generators' options work."""
from __future__ import annotations

import json

from dashboards_support import DASHBOARDS, PROMETHEUS_DIR, load_module, load_yaml, python

RENDER_RULES = PROMETHEUS_DIR / "render_rules.py"


def test_committed_dashboards_are_up_to_date():
    result = python("dashboards/build.py", "--check")
    assert result.returncode == 0, result.stderr


def test_build_is_deterministic_and_check_detects_a_stale_file(tmp_path, monkeypatch):
    build = load_module(DASHBOARDS / "build.py", "ttftscope_dashboards_build")
    first = build.render_dashboards()
    assert first == build.render_dashboards()
    assert set(first) == {"ttft-attribution.json", "engine.json"}
    for text in first.values():
        json.loads(text)

    monkeypatch.setattr(build, "GENERATED_DIR", tmp_path)
    assert build.main(["--check"]) == 1                 # nothing generated yet
    assert build.main([]) == 0
    assert build.main(["--check"]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == first
    stale = tmp_path / "engine.json"
    stale.write_text(stale.read_text().replace('"LLM engine"', '"renamed"', 1))
    assert build.main(["--check"]) == 1


def test_committed_alerting_files_are_up_to_date():
    result = python(str(RENDER_RULES), "--check")
    assert result.returncode == 0, result.stderr


def test_render_rules_overrides_land_in_every_file(tmp_path):
    url = "http://127.0.0.1:9999/hook"
    runbook = "https://docs.example.org/ttftscope/runbook.html"
    result = python(str(RENDER_RULES), "--ttft-threshold-s", "0.05", "--for", "30s",
                    "--client-ttft-threshold-s", "0.5", "--webhook-url", url,
                    "--runbook-url", runbook, "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr

    rules = {r["alert"]: r for g in load_yaml(tmp_path / "alerts.yml")["groups"]
             for r in g["rules"]}
    assert rules["LLMTTFTP95High"]["expr"].strip() == "llm:ttft_seconds:p95_5m > 0.05"
    assert rules["LLMClientTTFTP95High"]["expr"].strip().endswith("> 0.5")
    assert rules["LLMTTFTStageDominant"]["expr"].strip().endswith("> 0.05")
    assert {r["for"] for r in rules.values()} == {"30s"}
    assert {r["annotations"]["runbook_url"].strip().partition("#")[0]
            for r in rules.values()} == {runbook}

    receivers = load_yaml(tmp_path / "alertmanager.yml")["receivers"]
    assert [c["url"] for r in receivers for c in r["webhook_configs"]] == [url]

    # Prometheus rules and Alertmanager only: no Grafana-managed copy of an alert.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alertmanager.yml", "alerts.yml"]


def test_render_rules_rejects_a_nonsense_threshold(tmp_path):
    result = python(str(RENDER_RULES), "--ttft-threshold-s", "0", "--out-dir", str(tmp_path))
    assert result.returncode != 0
    assert "ttft_p95_s must be positive" in result.stderr
    assert not list(tmp_path.iterdir())
