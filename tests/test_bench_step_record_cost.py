"""bench/step_record_cost.py runs end to end and prints the step record's cost per step and
the on/off decode rates at each level, on the host's own plan (named in its first line)."""
from __future__ import annotations

import re

import torch

from tests.bench_script import run_bench_script


def test_step_record_cost_prints_per_step_cost_and_on_off_ratios():
    out = run_bench_script("step_record_cost.py", "--quick", timeout_s=600)
    assert f"torch capability {torch.backends.cpu.get_cpu_capability()}" in out
    cost = re.search(r"step record\s+([\d.]+) us per 16-sequence step", out)
    assert cost and float(cost.group(1)) > 0, out
    for streams in (1, 4):
        row = re.search(rf"\s{streams} streams\s+on\s+([\d.]+).*off\s+([\d.]+).*on/off ([\d.]+)",
                        out)
        assert row and all(float(v) > 0 for v in row.groups()), out
    kept = re.search(r"steps kept (\d+) of (\d+)", out)
    assert kept and 0 < int(kept.group(1)) <= int(kept.group(2)), out
