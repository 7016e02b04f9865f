"""bench/otlp_receiver.py runs end to end at tiny sizes and prints what run_all parses."""
from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def test_the_bench_prints_every_figure():
    out = run_bench_script("otlp_receiver.py", "--rounds", "2", "--exports", "4", "--spans", "50",
                           "--join-requests", "50", "--max-pending", "200", timeout_s=300)
    rows = run_all.parse_otlp_receiver(out)
    assert [r[0] for r in rows] == [
        "OTLP receiver, http", "OTLP receiver, grpc", "engine join per request, in-band signal",
        "engine join per request, no signal", "engine join pending table, 200 records"], out
