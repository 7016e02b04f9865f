"""bench/slow_clients.py runs end to end (small): the cap alone and a per-address cap starve
real clients behind trickling connections where reclaim serves them all, a per-address cap
refuses legitimate clients behind one address, and the reclaim pass is timed."""
from __future__ import annotations

import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_script import run_bench_script  # noqa: E402


def test_slow_clients_compares_the_policies():
    out = run_bench_script("slow_clients.py", "--quick", timeout_s=180)
    served = {(m[1].strip(), int(m[2])): int(m[3])
              for m in re.finditer(r"^  (.+?)\s{2,}(\d+)\s+(\d+)/4\b", out, re.MULTILINE)}
    assert served == {("cap only", 1): 0, ("per-address cap 2", 1): 4,
                      ("per-address cap 2", 8): 0, ("reclaim", 1): 4, ("reclaim", 8): 4}, out
    assert re.search(r"per-address cap 2\s+served 2/6", out), out
    assert re.search(r"reclaim\s+served 6/6", out), out
    assert re.search(r"none stalled .+\s\d+ µs", out) and re.search(r"median\s+\d+ µs", out), out
