"""bench/cold_path.py runs end to end: every pre-upstream step of the proxy gets a hot and an
after-idle time, and the idle one is not below the hot one's order (the bench's point)."""
from __future__ import annotations

import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_script import run_bench_script  # noqa: E402

STEPS = ("noop", "peek_request (JSON)", "new_request_id", "Tracer.begin (span ids, sampler)",
         "beacon token (HMAC)", "forward_headers", "upstream request bytes")


def test_cold_path_times_each_step_hot_and_after_idle():
    out = run_bench_script("cold_path.py", "--idle-ms", "2", "--samples", "5", timeout_s=120)
    rows = {}
    for line in out.splitlines():
        match = re.match(r"\s*(.+?)\s{2,}([\d.]+)\s+([\d.]+)\s+(\d+)x$", line)
        if match:
            rows[match.group(1)] = (float(match.group(2)), float(match.group(3)))
    assert set(rows) == set(STEPS), out
    assert all(hot > 0 and cold > 0 for hot, cold in rows.values()), out
    assert "sum of the steps" in out
