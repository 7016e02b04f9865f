"""bench/cpu_ops.py runs end to end (one round) and prints what run_all.py parses: every op at
1, 4 and 16 sequences, the hand-written matmuls against torch's, and the decode step, each
with a positive ratio."""
from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def test_cpu_ops_bench_prints_every_op_and_the_step():
    out = run_bench_script("cpu_ops.py", "--rounds", "1", timeout_s=300)
    rows = run_all.parse_cpu_ops(out)
    assert len(rows) == 3 * 3 + 3 + 3, out
    for _, value, _ in rows:
        assert float(value.rsplit("(", 1)[1].rstrip("x)")) > 0
