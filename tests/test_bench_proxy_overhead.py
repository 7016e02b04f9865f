"""bench/proxy_overhead.py at tiny sizes: the default tables run_all parses, the --scale
table, and the client counting failed streams instead of raising."""
from __future__ import annotations

import asyncio
import math
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench.lib import stream_client  # noqa: E402
from bench.lib.loopback import free_port  # noqa: E402
from bench.lib.span_sink import nginx_binary  # noqa: E402
from bench_script import run_bench_script  # noqa: E402

from tracer.testing.fake_upstream import FakeUpstream  # noqa: E402

def run_bench(*flags: str) -> str:
    return run_bench_script("proxy_overhead.py", *flags, timeout_s=240)


def test_default_run_prints_every_target_and_both_export_cpu_lines():
    out = run_bench("--rounds", "1", "--requests", "8", "--requests-single", "2",
                    "--chunks", "2", "--gap-ms", "2", "--long-chunks", "12",
                    "--concurrency", "1", "4", "--both-exports")
    names = ["direct"] + (["nginx"] if nginx_binary() else []) + ["proxy", "proxy-no-export"]
    rows = run_all.parse_proxy_overhead(out)
    ttft = [r[0] for r in rows if r[0].startswith("TTFT")]
    assert ttft == [f"TTFT @{c} streams {n}" for c in (1, 4) for n in names], out
    relaying = [n for n in names if n != "direct"]
    assert [r[0] for r in rows if r[0].startswith("CPU ") and "split" not in r[0]] == [
        f"CPU {n}" for n in relaying], out
    for row in rows:
        if row[0].startswith("CPU ") and "split" not in row[0]:
            user, system = map(float, re.search(r"user ([\d.]+) \+ system ([\d.]+)", row[1]).groups())
            total = float(row[1].split()[0])
            assert math.isclose(user + system, total, abs_tol=0.002), row   # rounding only
    split = {r[0]: r for r in rows if r[0].startswith("CPU split")}
    assert list(split) == [f"CPU split {n}" for n in relaying], out
    for name in relaying:
        # a proxy's line compares it with nginx's; nginx's own line compares nothing
        assert ("nginx's" in split[f"CPU split {name}"][2]) == (name != "nginx" and "nginx" in names)
    assert "failed streams: " + ", ".join(f"{n} 0" for n in names) in out


def test_scale_run_prints_failures_memory_and_ratios():
    out = run_bench("--scale", "--scale-concurrency", "4", "12", "--rounds", "1",
                    "--chunks", "3", "--gap-ms", "30")
    names = (["nginx"] if nginx_binary() else []) + ["proxy"]
    rows = re.findall(r"^\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                      r"\s+(\d+)\s+(-?[\d.]+)\s+(\d+)$", out, re.M)
    assert [(int(r[0]), r[1]) for r in rows] == [(c, n) for c in (4, 12) for n in names], out
    for c, name, n, failed, p50, p99, us_event, _, kib, num_open in rows:
        assert int(n) == 2 * int(c) and int(failed) == 0
        assert 0 < float(p50) <= float(p99)
        # In ns (bench/lib/process_cpu.py): even nginx's few ms of CPU in so short a run
        assert float(us_event) > 0
        assert math.isfinite(float(kib)) and 1 <= int(num_open) <= int(c)
    if nginx_binary():
        assert re.search(r"^proxy / nginx at 12 streams: p99 TTFT [\d.]+x, "
                         r"CPU per relayed event [\d.]+x$", out, re.M), out


def test_a_failed_stream_is_counted_not_raised():
    upstream = FakeUpstream(chunks=3, gap_ms=0).start()
    try:
        async def stream(mode: bytes):
            reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
            try:
                request = stream_client.request_bytes(upstream.port, b"x-fake-mode: " + mode + b"\r\n")
                return await stream_client.one_stream(reader, writer, request)
            finally:
                writer.close()
        assert asyncio.run(stream(b"stream")) > 0
        assert asyncio.run(stream(b"status_500")) is None
        assert asyncio.run(stream(b"cut")) is None
    finally:
        upstream.stop()
    batch = asyncio.run(stream_client.run_batch(free_port(), 2, 4))   # nothing listens
    assert (batch.num_failed, batch.ttft_ms) == (4, [])
