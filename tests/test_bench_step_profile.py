"""bench/step_profile.py runs end to end on the host's plan and prints what run_all.py parses:
decode at 1 and 16 sequences and a prefill, each with its wall time and top op."""
from __future__ import annotations

import pathlib
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def test_step_profile_prints_each_case_on_the_hosts_plan():
    out = run_bench_script("step_profile.py", "--steps", "1", "--top", "3", timeout_s=300)
    assert f"cpu_capability {torch.backends.cpu.get_cpu_capability()}" in out
    rows = run_all.parse_step_profile(out)
    assert [name for name, _, _ in rows] == ["step profile: decode, 1 sequence",
                                             "step profile: decode, 16 sequences",
                                             "step profile: prefill, 256 tokens"], out
    assert all(float(value.split()[0]) > 0 for _, value, _ in rows)
