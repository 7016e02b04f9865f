"""Soak: fill every bounded structure, then N concurrent streams for M minutes; RSS over time.

    .venv/bin/python bench/soak.py [--target engine|proxy] [--streams 8] [--minutes 10]
                                   [--warmup-minutes 10] [--interval-s 30] [--max-tokens 64]
                                   [--chunks 20000] [--gap-ms 0.5] [--trace-store-capacity 200]
                                   [--step-log-size 1024] [--num-kv-blocks 256]
                                   [--join-max-pending 200]

`--target engine` (the default) starts `python -m instrumented_engine serve` (the packaged
SmolLM2, tracing on) on a free loopback port; `--streams` clients each post streamed chat
completions back to back, each prompt a shared head (prefix-cache hits) and lines no other
prompt has (misses; pieces for the diagnosis).

`--target proxy` starts the fake upstream (`tracer.testing.fake_upstream`, `--chunks`
content events `--gap-ms` apart: 20,000 events 0.5 ms apart, a stream of ~10-20 s alone,
longer where the cores are the limit: ~35 s at 16 streams on two shared cores) and
`python -m tracer proxy` in front of it (tracing on, no exporter, the engine join waiting a
day for spans that never come), both on loopback, and soaks the proxy (the issue's setting
is `--streams 16`). `--max-tokens`, `--step-log-size` and `--num-kv-blocks` are the engine
mode's, `--chunks`, `--gap-ms` and `--join-max-pending` the proxy mode's; one given to the
other mode is refused.

Warm-up: the server runs with small bounds (the flags above), and the streams run until the
server itself reports every bounded structure full (bench/lib/soak_fill.py says how each is
read), at most `--warmup-minutes`; a bound not full by then fails the soak before any
measurement. Then the measured phase: `--minutes`, RSS (psutil) every `--interval-s`, and
RSS at its start and end, the max, and the slope of a least-squares fit in MiB per 10
minutes. Before the servers start, bench/lib/soak_costs.py measures what each structure
costs at its bound (tracemalloc, in this process). A request counts as ok when it answered 200 and
its stream reached `data: [DONE]`; one cut by the end of the soak counts as neither.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # bench.lib, when run as `python bench/soak.py`

from bench.lib.loopback import start_listening  # noqa: E402
from bench.lib.soak_costs import print_costs  # noqa: E402
from bench.lib.soak_fill import JOIN_WAIT_S, MAX_LISTED, fills, kv_usage, prompt  # noqa: E402

GROWTH_TARGET_PCT = 5.0
PROXY_MODEL = "fake-model"     # tracer.testing.fake_upstream's
_COUNT_LOCK = threading.Lock()
# Flags of one mode only, and their defaults.
ENGINE_ONLY = {"max_tokens": 64, "step_log_size": 1024, "num_kv_blocks": 256}
PROXY_ONLY = {"chunks": 20000, "gap_ms": 0.5, "join_max_pending": 200}


def stream_forever(base_url: str, model: str, worker: int, max_tokens: int,
                   stop: threading.Event, counts: dict) -> None:
    with httpx.Client(base_url=base_url, timeout=120, trust_env=False) as client:
        n = 0
        while not stop.is_set():
            n += 1
            body = {"model": model, "stream": True, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": prompt(worker, n)}]}
            done, tail = False, b""
            try:
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    for data in response.iter_bytes():
                        tail = (tail + data)[-32:]   # [DONE] may straddle two reads
                        if stop.is_set():
                            break
                    else:
                        done = response.status_code == 200 and b"data: [DONE]" in tail
            except httpx.HTTPError:
                pass
            if stop.is_set() and not done:
                return                               # cut by the soak's end: not a result
            with _COUNT_LOCK:
                counts["ok" if done else "failed"] += 1


# The soak fills and measures the process's own bounded structures, the ring of records
# among them (its fill is read from /ui/api/requests, which with a database lists every
# stored record). The database-backed store, its file and its writer's queue have a soak of
# their own: bench/store_bench.py --only soak.
STORE_FLAGS = ("--store", "memory")


def start_engine(env: dict, logs: Path, args) -> tuple[list[subprocess.Popen], str, str]:
    port, server = start_listening(
        lambda port: [sys.executable, "-m", "instrumented_engine", "serve", "--host",
                      "127.0.0.1", "--port", str(port), "--log-format", "json",
                      "--trace-store-capacity", str(args.trace_store_capacity),
                      *STORE_FLAGS, "--step-log-size", str(args.step_log_size),
                      "--num-kv-blocks", str(args.num_kv_blocks)],
        logs / "engine.log", timeout_s=180, cwd=ROOT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while httpx.get(base_url + "/health", timeout=30).status_code != 200:   # warming up
        if time.monotonic() > deadline:
            raise TimeoutError("the engine did not get ready in 180 s")
        time.sleep(0.25)  # polling a starting process; not a test
    model = httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
    return [server], base_url, model


def start_proxy(env: dict, logs: Path, args) -> tuple[list[subprocess.Popen], str, str]:
    """The fake upstream, then the proxy (last in the list: the process soaked)."""
    quiet = dict(cwd=ROOT, env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "",
                                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""})
    upstream_port, upstream = start_listening(
        lambda port: [sys.executable, "-m", "tracer.testing.fake_upstream", "--port", str(port),
                      "--chunks", str(args.chunks), "--gap-ms", str(args.gap_ms)],
        logs / "fake-upstream.log", **quiet)
    processes = [upstream]
    try:
        # Spans expected from the first request and never sent: every record parks in the
        # engine join until the table is full and pushes its oldest out (bench/lib/soak_fill.py).
        port, proxy = start_listening(
            lambda port: [sys.executable, "-m", "tracer", "proxy", "--upstream",
                          f"http://127.0.0.1:{upstream_port}", "--listen", f"127.0.0.1:{port}",
                          "--served-model-name", PROXY_MODEL, "--log-format", "json",
                          "--trace-store-capacity", str(args.trace_store_capacity),
                          *STORE_FLAGS, "--engine-spans-expected", "--engine-join-wait-s", str(JOIN_WAIT_S),
                          "--engine-join-max-pending", str(args.join_max_pending)],
            logs / "proxy.log", **quiet)
    except BaseException:
        upstream.terminate()
        raise
    processes.append(proxy)
    return processes, f"http://127.0.0.1:{port}", PROXY_MODEL


def warm_up(server: subprocess.Popen, base_url: str, args, counts: dict,
            stop: threading.Event) -> tuple[bool, float]:
    """Polls the server until every bound is full (True) or `--warmup-minutes` pass; prints
    the fills every `--interval-s`. Returns (all full, the highest KV usage seen)."""
    start = time.monotonic()
    deadline = start + args.warmup_minutes * 60
    next_print, kv_max = start, 0.0
    with httpx.Client(base_url=base_url, timeout=30, trust_env=False) as client:
        while server.poll() is None:
            now = time.monotonic()
            state = fills(client, args.target, vars(args))
            if args.target == "engine":
                kv_max = max(kv_max, kv_usage(client))
            done = all(f.full for f in state)
            if now >= next_print or done or now >= deadline:
                rss = psutil.Process(server.pid).memory_info().rss / 2**20
                print(f"warm-up {now - start:5.0f} s  rss {rss:7.1f} MiB  requests "
                      f"{counts['ok']}/{counts['failed']} failed", flush=True)
                for f in state:
                    print(f"  {'FULL' if f.full else 'fill'}  {f.name}: bound {f.bound}; "
                          f"{f.progress}", flush=True)
                next_print += args.interval_s
            if done or now >= deadline:
                return done, kv_max
            stop.wait(1.0)   # the next poll of /metrics; the deadline bounds the loop
    return False, kv_max


def sample_rss(server: subprocess.Popen, counts: dict, minutes: float, interval_s: float,
               stop: threading.Event) -> list[tuple[float, int]]:
    """(seconds since start, RSS bytes) every `interval_s` and at the end, printed as taken."""
    process = psutil.Process(server.pid)
    start = time.monotonic()
    end = start + minutes * 60
    samples: list[tuple[float, int]] = []
    print(f"{'t_s':>7} {'rss_mib':>9} {'requests':>9} {'failed':>7}", flush=True)
    next_sample = start
    while True:
        now = time.monotonic()
        if now >= next_sample:
            rss = process.memory_info().rss
            samples.append((now - start, rss))
            print(f"{now - start:7.0f} {rss / 2**20:9.1f} {counts['ok']:9d} "
                  f"{counts['failed']:7d}", flush=True)
            next_sample += interval_s
        if now >= end or server.poll() is not None:
            break
        stop.wait(min(next_sample, end) - now)
    if server.poll() is None:
        samples.append((time.monotonic() - start, process.memory_info().rss))
    return samples


def slope_mib_per_10min(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, in MiB per 10 minutes.

    >>> round(slope_mib_per_10min([(0, 0), (300, 2**20), (600, 2 * 2**20)]), 3)
    2.0
    """
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_r = sum(r for _, r in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (r - mean_r) for t, r in samples)
    return cov / var * 600 / 2**20


def summarize(samples: list[tuple[float, int]], counts: dict, args, server_exited: bool,
              rss_ready: int, bounds: list) -> dict:
    base, end = samples[0][1], samples[-1][1]
    growth_pct = 100 * (end - base) / base
    return {"target": args.target, "streams": args.streams, "minutes": args.minutes,
            "requests_ok": counts["ok"], "requests_failed": counts["failed"],
            "bounds_full": {f.name: f.full for f in bounds},
            "rss_ready_mib": round(rss_ready / 2**20, 1),
            "rss_after_warmup_mib": round(base / 2**20, 1),
            "rss_end_mib": round(end / 2**20, 1),
            "rss_max_mib": round(max(r for _, r in samples) / 2**20, 1),
            "slope_mib_per_10min": round(slope_mib_per_10min(samples), 2),
            "growth_after_warmup_pct": round(growth_pct, 2),
            "growth_target_met": growth_pct < GROWTH_TARGET_PCT,
            "server_exited": server_exited}


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("engine", "proxy"), default="engine")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0, help="the measured phase")
    parser.add_argument("--warmup-minutes", type=float, default=10.0,
                        help="the longest the warm-up may take to fill every bound")
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--trace-store-capacity", type=int, default=200)
    for name, default in {**ENGINE_ONLY, **PROXY_ONLY}.items():
        mode = "engine" if name in ENGINE_ONLY else "proxy"
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default),
                            help=f"{mode} only (default {default})")
    args = parser.parse_args(argv)
    wrong = PROXY_ONLY if args.target == "engine" else ENGINE_ONLY
    for name in wrong:
        if getattr(args, name) is not None:
            parser.error(f"--{name.replace('_', '-')} does not apply to --target {args.target}")
    for name, default in {**ENGINE_ONLY, **PROXY_ONLY}.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not 1 <= args.trace_store_capacity <= MAX_LISTED:
        parser.error(f"--trace-store-capacity: 1 to {MAX_LISTED} (the warm-up lists the store)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A soak stopped with SIGTERM (kill, a CI timeout) still stops its servers: Python's
    # default SIGTERM ends the process without running the `finally` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes: list[subprocess.Popen] = []
    stop = threading.Event()
    logs_dir = tempfile.TemporaryDirectory(prefix="soak-")   # the servers' stderr
    logs = Path(logs_dir.name)
    try:
        start = start_proxy if args.target == "proxy" else start_engine
        processes, base_url, model = start(env, logs, args)
        server = processes[-1]
        rss_ready = psutil.Process(server.pid).memory_info().rss
        dtype = None
        if args.target == "engine":
            card = httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]
            dtype = card.get("engine", {}).get("dtype")
        print_costs(args, dtype)   # before any request: the server is idle
        counts = {"ok": 0, "failed": 0}
        workers = [threading.Thread(target=stream_forever, daemon=True,
                                    args=(base_url, model, i, args.max_tokens, stop, counts))
                   for i in range(args.streams)]
        print(f"soak: {args.streams} streams against the {args.target} at {base_url}; RSS "
              f"ready {rss_ready / 2**20:.1f} MiB; warm-up until every bound is full (at most "
              f"{args.warmup_minutes:g} min), then {args.minutes:g} min measured", flush=True)
        for worker in workers:
            worker.start()
        full, kv_max = warm_up(server, base_url, args, counts, stop)
        with httpx.Client(base_url=base_url, timeout=30, trust_env=False) as client:
            bounds = fills(client, args.target, vars(args))
        if args.target == "engine":
            print(f"  highest llm_kv_cache_usage_ratio seen in the warm-up: {kv_max:.2f}")
        if not full:
            print("warm-up: not every bound was full in time; nothing measured", flush=True)
            return 1
        print(f"warm-up done: every bound full; measuring {args.minutes:g} min", flush=True)
        samples = sample_rss(server, counts, args.minutes, args.interval_s, stop)
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
        summary = summarize(samples, counts, args, server.poll() is not None, rss_ready, bounds)
        print(f"RSS ready {summary['rss_ready_mib']} MiB, measured phase start "
              f"{summary['rss_after_warmup_mib']} MiB, end {summary['rss_end_mib']} MiB, max "
              f"{summary['rss_max_mib']} MiB; slope {summary['slope_mib_per_10min']:+.2f} MiB "
              "per 10 min (least squares)", flush=True)
        print(f"RSS growth after warm-up: {summary['growth_after_warmup_pct']:+.2f} % (target "
              f"< {GROWTH_TARGET_PCT:g} %: {'met' if summary['growth_target_met'] else 'missed'})",
              flush=True)
        print(json.dumps(summary), flush=True)
        return 0 if counts["failed"] == 0 and not summary["server_exited"] else 1
    finally:
        stop.set()
        for proc in reversed(processes):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        logs_dir.cleanup()


if __name__ == "__main__":
    sys.exit(main())
