"""bench/timeline_cost.py runs end to end on a small store and prints both answers' times,
sizes and peak memory."""
from __future__ import annotations

import re

from tests.bench_script import run_bench_script


def test_timeline_cost_prints_both_answers():
    out = run_bench_script("timeline_cost.py", "--requests", "300", "--trials", "2",
                           timeout_s=300)
    assert "300 records in the store" in out, out
    for name in ("timeline, every record", "trace \\+ neighbours"):
        row = re.search(rf"{name}\s+median\s+([\d.]+) ms\s+max\s+([\d.]+) ms\s+answer\s+([\d.]+)"
                        rf" KiB\s+peak\s+([\d.]+) MiB", out)
        assert row and all(float(v) > 0 for v in row.groups()[:3]), out
