"""tools/render_figures.py: docs/figures-latest.md from a `bench/run_all.py --json` summary,
with the machine it ran on and which benches the run left out; the committed page is its
output (its header says so)."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import render_figures  # noqa: E402

SUMMARY = {
    "machine": {"cpu_model": "AMD EPYC 9R14", "avx512f": True, "logical_cpus": 2,
                "torch_cpu_capability": "AVX512", "torch_version": "2.13.0+cpu",
                "python_version": "3.11.7", "system": "Linux 6.1 x86_64",
                "date_utc": "2026-12-01 10:00 UTC", "git_commit": "abc1234", "git_dirty": False},
    "command": "bench/run_all.py --json .bench-output/summary.json",
    "benches_available": ["probe_size", "tracer_cost", "gpu_check"],
    "benches": [
        {"bench": "probe_size", "status": "ok", "seconds": 0.8, "log": ".bench-output/p.log",
         "figures": [{"figure": "probe.global.js min+gzip", "value": "3064 B",
                      "target": "<= 3072 B"},
                     {"figure": "a | b", "value": "1 | 2", "target": ""}]},
        {"bench": "gpu_check", "status": "skipped (no nvidia-smi)", "seconds": 0.0, "log": "",
         "figures": []},
    ],
}


def test_page_names_the_machine_the_run_and_every_figure():
    page = render_figures.render(SUMMARY)
    lines = page.splitlines()
    assert lines[0] == "# Figures from the last bench run"
    assert render_figures.GENERATED in lines
    assert "[figures.md](figures.md)" in page
    assert "- **CPU**: AMD EPYC 9R14, 2 logical CPUs available to the run; AVX-512 " \
           "(`avx512f`): yes" in lines
    assert "- **torch CPU capability** (what the engine picks its formats from): AVX512 " \
           "(torch 2.13.0+cpu)" in lines
    assert "- **started**: 2026-12-01 10:00 UTC, at commit `abc1234`" in lines
    assert "Benches in this run (2): `probe_size` (ok, 1 s), `gpu_check` (skipped (no " \
           "nvidia-smi), 0 s)." in lines
    assert "Not in this run (1; `make bench` runs every one): `tracer_cost`." in lines
    assert "| `probe_size` | probe.global.js min+gzip | 3064 B | <= 3072 B |" in lines
    assert "|  | a \\| b | 1 \\| 2 |  |" in lines          # a pipe stays inside its cell
    assert "| `gpu_check` | (skipped (no nvidia-smi): no figures) |  |  |" in lines


def test_a_dirty_checkout_and_a_full_run_say_so():
    summary = {**SUMMARY, "machine": {**SUMMARY["machine"], "git_dirty": True,
                                      "avx512f": None},
               "benches_available": ["probe_size", "gpu_check"]}
    page = render_figures.render(summary)
    assert "at commit `abc1234` with uncommitted changes" in page
    assert "(`avx512f`): unknown" in page
    assert "Not in this run" not in page


def test_main_writes_the_page_and_refuses_an_old_summary(tmp_path):
    src, out = tmp_path / "summary.json", tmp_path / "figures-latest.md"
    src.write_text(json.dumps(SUMMARY))
    assert render_figures.main([str(src), "--out", str(out)]) == 0
    assert out.read_text() == render_figures.render(SUMMARY)
    src.write_text(json.dumps(SUMMARY["benches"]))   # run_all's list, before the machine
    with pytest.raises(SystemExit, match="names no machine"):
        render_figures.main([str(src), "--out", str(out)])


def test_the_committed_page_is_generated():
    page = (REPO / "docs" / "figures-latest.md").read_text()
    assert page.splitlines()[:3] == ["# Figures from the last bench run", "",
                                     render_figures.GENERATED]
    assert "- **CPU**: " in page and "| bench | figure | value | target |" in page
