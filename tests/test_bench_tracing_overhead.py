"""bench/tracing_overhead.py end to end at a tiny size (two real engine servers, 1-token
requests): every per-round line with its requests/s and CPU per request, the paired requests/s
ratio with its range, the CPU per request on vs off, and the lines run_all parses."""
from __future__ import annotations

import math
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402

NUM = r"(-?\d+(?:\.\d+)?)"
ROUNDS = 2


def test_short_requests_print_per_round_and_paired_figures():
    out = run_bench_script("tracing_overhead.py", "--rounds", str(ROUNDS), "--num-requests", "8",
                           "--output-tokens", "1", "--prompt-tokens", "8", "--concurrency", "4",
                           timeout_s=600)
    assert f"{ROUNDS} rounds, 8 requests a batch, 4 streams, ~8-token prompts, 1 output tokens" in out
    rounds = re.findall(rf"^round (\d+) tracing (on |off)\s+{NUM} tok/s\s+TTFT p50\s+{NUM} ms\s+"
                        rf"failed (\d+)\s+{NUM} req/s\s+CPU\s+{NUM} ms/request$", out, re.M)
    # interleaved: the order alternates by round
    assert [(int(r[0]), r[1].strip()) for r in rounds] == [
        (0, "on"), (0, "off"), (1, "off"), (1, "on")], out
    for _, _, tok_s, ttft_ms, failed, req_s, cpu_ms in rounds:
        assert int(failed) == 0, out
        assert all(float(x) > 0 for x in (tok_s, ttft_ms, req_s, cpu_ms)), out
        # 1 output token a request: output tok/s is requests/s (both rounded to print)
        assert math.isclose(float(tok_s), float(req_s), abs_tol=0.06), out

    ratio = re.search(rf"^requests/s on/off  {NUM} \(paired {NUM}-{NUM}, (\d+) rounds\)  "
                      r"\(target >= 0\.99\)$", out, re.M)
    assert ratio and int(ratio[4]) == ROUNDS, out
    median, low, high = map(float, ratio.group(1, 2, 3))
    assert 0 < low <= high and low - 0.005 <= median <= high + 0.005, out

    rps = re.search(rf"^requests/s\s+on {NUM}, off {NUM} \(median over rounds\)$", out, re.M)
    assert rps and float(rps[1]) > 0 and float(rps[2]) > 0, out
    cpu = re.search(rf"^CPU per request\s+on {NUM} ms, off {NUM} ms \(median over rounds\): "
                    rf"([-+]\d+\.\d) %, ([-+]\d+\.\d+) ms$", out, re.M)
    assert cpu and float(cpu[1]) > 0 and float(cpu[2]) > 0, out
    assert math.isclose(float(cpu[4]), float(cpu[1]) - float(cpu[2]), abs_tol=0.02), out
    assert math.isclose(float(cpu[3]), (float(cpu[1]) / float(cpu[2]) - 1) * 100, abs_tol=0.2), out

    rows = run_all.parse_tracing_overhead(out)
    assert [r[0] for r in rows] == ["throughput tracing on/off", "TTFT p50 tracing on/off"], out
    assert all(float(r[1]) > 0 for r in rows), out
