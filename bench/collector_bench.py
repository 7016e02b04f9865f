"""The standalone collector (`python -m tracer collect`): accepted beacons per second per core
on loopback, and its memory after 100,000 beacons.

    .venv/bin/python bench/collector_bench.py [--num-beacons 100000] [--rate-beacons 5000]

The real CLI runs as its own process, pinned to one CPU; the client (httpx, keep-alive, in
this process) is pinned to another. Every beacon is a distinct trace with a signed in-band
timing token (tracer/web/inband.py) from its own forwarded address (the collector trusts
loopback's X-Forwarded-For, its default), so each one is verified, aligned, checked for
buffering, observed in the client metrics and exported as client spans over OTLP (to an
nginx sink, bench/lib/span_sink.py, so receiving them loads no measured core).

Printed: beacons/s of wall time, beacons per CPU-second of the collector process (its
utime+stime from /proc: "per core"), and its resident memory at checkpoints while
100,000 beacons go through with `--max-joined-traces 10000`: flat once the remembered
trace ids and the rate limiter's 10,000 address buckets are full.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.lib.loopback import free_port, wait_listening  # noqa: E402
from bench.lib.process_cpu import process_cpu_s  # noqa: E402
from bench.lib.span_sink import span_sink  # noqa: E402
from tracer.web.inband import InbandTiming, encode_token  # noqa: E402
from tracer.web.probe.token import BeaconSigner  # noqa: E402

KEY = "collector-bench-key"
MODEL = "SmolLM2-135M-Instruct"
SEND_MS = tuple(20.0 + 15.0 * i for i in range(32))
# Requests received a few minutes before the run: an in-band token older than its stream plus
# an hour is refused as a replay (tracer/web/probe/ingest.py, `stale_token_error`), so a
# fixed date stops working an hour after it.
RECV_BASE_NS = time.time_ns() - 300 * 10**9


def beacon(i: int, signer: BeaconSigner) -> bytes:
    trace_id = f"{i + 1:032x}"
    timing = InbandTiming(trace_id, f"{i + 1:016x}", "engine", MODEL,
                          RECV_BASE_NS + i * 1_000, 2.0, SEND_MS[0], SEND_MS,
                          {"receive": 0.3, "prefill": 15.0, "send": 0.1})
    return json.dumps({
        "v": 1, "trace_id": trace_id, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
        "url_path": "/v1/chat/completions", "status": 200, "outcome": "ok",
        "t": {"start": 0, "headers": 12.0, "first_byte": 30.0, "first_token": 30.0,
              "first_paint": 38.0, "end": 520.0},
        "chunks": 32, "chunk_ms": [s + 10.0 for s in SEND_MS],
        "itl_ms": {"count": 31, "mean": 15.0, "p50": 15.0, "p95": 16.0, "max": 18.0},
        "resource": None, "probe_errors": 0, "sdk": "ttftscope-probe/0.1.0",
        "server": encode_token(timing, signer)}).encode()


def cpu_s(pid: int) -> float:
    return process_cpu_s(pid)   # in ns: /proc/PID/stat's 10 ms ticks read 0 for a short phase


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def send(client: httpx.Client, bodies, first: int, path: str = "/v1/probe",
         content_type: str = "text/plain", status: int = 202) -> None:
    """Each body from its own forwarded address (the rate limit is per client)."""
    for i, body in enumerate(bodies, first):
        r = client.post(path, content=body, headers={
            "content-type": content_type, "x-forwarded-for": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"})
        assert r.status_code == status, r.text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-beacons", type=int, default=100_000)
    parser.add_argument("--rate-beacons", type=int, default=5_000)
    parser.add_argument("--max-joined-traces", type=int, default=10_000)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cpus[0], cpus[-1]
    os.sched_setaffinity(0, {client_cpu})
    signer = BeaconSigner(KEY.encode())
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, span_sink(Path(tmp)) as traces_url:
        env = {**os.environ, "TTFTSCOPE_BEACON_KEY": KEY,
               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url}
        proc = subprocess.Popen(
            ["taskset", "-c", str(server_cpu), sys.executable, "-m", "tracer", "collect",
             "--listen", f"127.0.0.1:{port}", "--served-model-name", MODEL,
             "--max-joined-traces", str(args.max_joined_traces), "--log-format", "json"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port, proc)
            bodies = [beacon(i, signer) for i in range(args.num_beacons)]
            checkpoints = sorted(m for m in {10_000, args.num_beacons // 2, args.num_beacons}
                                 if 200 + args.rate_beacons <= m <= args.num_beacons)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                send(client, bodies[:200], 0)      # warm-up: imports, first allocations
                cpu0, t0 = cpu_s(proc.pid), time.perf_counter()
                send(client, bodies[200:200 + args.rate_beacons], 200)
                wall_s, busy_s = time.perf_counter() - t0, cpu_s(proc.pid) - cpu0
                print(f"collector on loopback, one core, {args.rate_beacons:,} signed beacons "
                      f"(keep-alive httpx client on another core):")
                print(f"  accepted            {args.rate_beacons / wall_s:>9,.0f} beacons/s wall")
                print(f"  per collector core  {args.rate_beacons / busy_s:>9,.0f} beacons per "
                      f"CPU-second ({busy_s / wall_s:.0%} of its core busy)")
                print(f"collector memory (RSS), --max-joined-traces {args.max_joined_traces:,}, "
                      f"every beacon from its own address:")
                sent = 200 + args.rate_beacons
                for mark in checkpoints:
                    send(client, bodies[sent:mark], sent)
                    sent = mark
                    print(f"  after {sent:>7,} beacons: {rss_mib(proc.pid):7.1f} MiB")
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            accepted = next(line for line in metrics.splitlines()
                            if line.startswith('llm_probe_beacons_total{outcome="accepted"}'))
            print(f"  ({accepted})")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
