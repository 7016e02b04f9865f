"""bench/collector_path_bench.py runs end to end at tiny sizes and prints what run_all parses."""
from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def test_the_bench_prints_every_figure():
    out = run_bench_script("collector_path_bench.py", "--traces", "20", "--pending", "50",
                           timeout_s=300)
    rows = run_all.parse_collector_path(out)
    assert [r[0] for r in rows] == [
        "collector whole path: spans per core",
        "collector whole path: beacons (trace complete) per core",
        "collector RSS with 50 traces pending"], out
    # every beacon completed its trace; the pending ones are still held
    assert "llm_collector_pending_traces 50.0" in out
    assert 'llm_collector_traces_total{outcome="complete"} 220.0' in out
