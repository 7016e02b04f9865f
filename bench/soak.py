"""Soak: N concurrent streams for M minutes against the engine server; its RSS over time.

    .venv/bin/python bench/soak.py [--streams 8] [--minutes 10] [--warmup-minutes 1]
                                   [--interval-s 30] [--max-tokens 64]

Starts `python -m instrumented_engine serve` (the packaged SmolLM2, tracing on) on a free
loopback port, runs `--streams` clients that each post streamed chat completions back to
back (varied prompts, so the prefix cache both hits and misses), and prints the server's
RSS every `--interval-s`. Growth is measured from the first sample after `--warmup-minutes`
(allocator pools, the trace store filling to its capacity and torch's caches settle first)
to the last. The issue's target is under 5 % after warm-up, at 8 streams for 10 minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from loopback import free_port, wait_listening

ROOT = Path(__file__).resolve().parents[1]
_COUNT_LOCK = threading.Lock()


def stream_forever(base_url: str, model: str, worker: int, max_tokens: int,
                   stop: threading.Event, counts: dict) -> None:
    with httpx.Client(base_url=base_url, timeout=120, trust_env=False) as client:
        n = 0
        while not stop.is_set():
            n += 1
            body = {"model": model, "stream": True, "max_tokens": max_tokens,
                    "messages": [{"role": "user",
                                  "content": f"Worker {worker}, request {n % 50}: tell me a fact."}]}
            try:
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    ok = response.status_code == 200
                    for _ in response.iter_bytes():
                        if stop.is_set():
                            break
            except httpx.HTTPError:
                ok = False
            with _COUNT_LOCK:
                counts["ok" if ok else "failed"] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=1.0)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    warmup_s = min(args.warmup_minutes * 60, args.minutes * 60 / 2)

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "instrumented_engine", "serve",
                               "--host", "127.0.0.1", "--port", str(port),
                               "--log-format", "json"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    stop = threading.Event()
    try:
        wait_listening(port, server, timeout_s=180)
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while httpx.get(base_url + "/health", timeout=30).status_code != 200:   # warming up
            if time.monotonic() > deadline:
                raise TimeoutError("the engine did not get ready in 180 s")
            time.sleep(0.25)  # polling a starting process; not a test
        model = httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
        process = psutil.Process(server.pid)
        counts = {"ok": 0, "failed": 0}
        workers = [threading.Thread(target=stream_forever, daemon=True,
                                    args=(base_url, model, i, args.max_tokens, stop, counts))
                   for i in range(args.streams)]
        for worker in workers:
            worker.start()
        start = time.monotonic()
        end = start + args.minutes * 60
        samples: list[tuple[float, int]] = []
        print(f"soak: {args.streams} streams for {args.minutes:g} min against {base_url} "
              f"(warm-up {warmup_s:.0f} s)", flush=True)
        print(f"{'t_s':>7} {'rss_mib':>9} {'requests':>9} {'failed':>7}", flush=True)
        next_sample = start
        while True:
            now = time.monotonic()
            if now >= next_sample:
                rss = process.memory_info().rss
                samples.append((now - start, rss))
                print(f"{now - start:7.0f} {rss / 2**20:9.1f} {counts['ok']:9d} "
                      f"{counts['failed']:7d}", flush=True)
                next_sample += args.interval_s
            if now >= end or server.poll() is not None:
                break
            stop.wait(min(next_sample, end) - now)
        rss = process.memory_info().rss
        samples.append((time.monotonic() - start, rss))
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
        after = [s for s in samples if s[0] >= warmup_s]
        base = after[0][1] if after else samples[0][1]
        growth = (samples[-1][1] - base) / base
        summary = {"streams": args.streams, "minutes": args.minutes, "warmup_s": warmup_s,
                   "requests_ok": counts["ok"], "requests_failed": counts["failed"],
                   "rss_after_warmup_mib": round(base / 2**20, 1),
                   "rss_end_mib": round(samples[-1][1] / 2**20, 1),
                   "growth_after_warmup_pct": round(100 * growth, 2),
                   "server_exited": server.poll() is not None}
        print(json.dumps(summary), flush=True)
        return 0 if counts["failed"] == 0 and server.poll() is None else 1
    finally:
        stop.set()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
