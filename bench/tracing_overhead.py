"""Instrumentation overhead, A/B interleaved in one run (issue: tracer and server).

    .venv/bin/python bench/tracing_overhead.py [--rounds 3] [--num-requests 32]
    .venv/bin/python bench/tracing_overhead.py --compare diagnosis   # on: verdicts, off: none

Starts two engine servers on loopback — tracing on (spans exported over OTLP/HTTP to
`bench/lib/span_sink.py`) and `--no-tracing` — and drives the same
load at each in turn (16 concurrent streams, ~128-token prompts, 64 output tokens), so slow
drift of the machine hits both alike. Only one server is loaded at a time; the idle one costs
nothing. Prints per-round figures, then the median throughput ratio (on/off) and TTFT p50
ratio. Targets: throughput >= 0.98, TTFT p50 <= 1.02. With `--compare diagnosis` both servers
trace, and "off" runs `--no-diagnosis`: what the TTFT verdict costs the served requests.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lib.loopback import free_port  # noqa: E402
from bench.lib.span_sink import span_sink  # noqa: E402
from tracer.bench.runner import BenchConfig, run_bench  # noqa: E402


def start_server(port: int, off_flag: str | None, threads: int,
                 traces_url: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "instrumented_engine", "serve", "--port", str(port),
           "--num-threads", str(threads), "--log-format", "json"]
    if off_flag is not None:
        cmd.append(off_flag)
    # Logs go to a null sink: both sides pay the same (none) for the log line I/O. Spans
    # are exported as in production, to a sink that costs these cores nothing.
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "",
                                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url})


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:   # 503: warming up
                return httpx.get(url + "/v1/models", timeout=2).json()["data"][0]["id"]
            time.sleep(0.25)
        except httpx.HTTPError:
            time.sleep(0.25)  # polling a starting process; not a test
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


# --compare: what the "off" server is started without.
OFF_FLAGS = {"tracing": "--no-tracing", "diagnosis": "--no-diagnosis"}


def one_run(url: str, model: str, num_requests: int, seed: int) -> dict:
    config = BenchConfig(base_url=url, model=model, num_requests=num_requests, concurrency=16,
                         prompt_tokens=128, output_tokens=64, seed=seed, num_warmup=2)
    return asyncio.run(run_bench(config)).summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", choices=tuple(OFF_FLAGS), default="tracing",
                        help="what the 'off' server leaves out (default tracing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracing-ab-") as tmp, span_sink(Path(tmp)) as traces_url:
        run_ab(args, traces_url)


def run_ab(args, traces_url: str) -> None:
    ports = {"on": free_port(), "off": free_port()}
    procs = {side: start_server(port, None if side == "on" else OFF_FLAGS[args.compare],
                                args.threads, traces_url)
             for side, port in ports.items()}
    try:
        urls = {side: f"http://127.0.0.1:{port}" for side, port in ports.items()}
        model = {side: wait_ready(urls[side], procs[side]) for side in urls}["on"]
        results: dict[str, list[dict]] = {"on": [], "off": []}
        for r in range(args.rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for side in order:
                s = one_run(urls[side], model, args.num_requests, seed=r)
                results[side].append(s)
                print(f"round {r} {args.compare} {side:3s}  {s['output_throughput_tok_s']:7.1f} tok/s  "
                      f"TTFT p50 {s['median_ttft_ms']:7.1f} ms  failed {s['failed']}", flush=True)
        tput = {k: statistics.median(x["output_throughput_tok_s"] for x in v) for k, v in results.items()}
        ttft = {k: statistics.median(x["median_ttft_ms"] for x in v) for k, v in results.items()}
        print(f"throughput on/off  {tput['on'] / tput['off']:.3f}  (target >= 0.98)")
        print(f"TTFT p50 on/off    {ttft['on'] / ttft['off']:.3f}  (target <= 1.02)")
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
