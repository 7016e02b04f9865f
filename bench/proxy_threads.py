"""Where the proxy's CPU goes, thread by thread: the event loop, the tracer's record worker,
the store's writer and the rest (the span export's thread, the garbage of a start-up), per
request under load and per second when idle.

    .venv/bin/python bench/proxy_threads.py [--chunks 64] [--gap-ms 20] [--concurrency 8]
                                            [--requests 64] [--rounds 3] [--idle-s 3] [--no-export]

One `python -m tracer proxy`, started as bench/proxy_overhead.py starts its own (tracing on,
the SQLite store in a temporary folder, spans exported over OTLP/HTTP to
`bench/lib/span_sink.py`), in front of the fake
upstream (`--chunks` content events `--gap-ms` apart), loaded by `bench/lib/stream_client.py`'s
`run_batch` as `bench/proxy_overhead.py` loads it (its streams staggered by a stream's length
over the concurrency). Each thread's CPU is the kernel's count in ns
(`/proc/PID/task/TID/schedstat`), its wake-ups the voluntary context switches; threads are
told apart by the names the tracer gives them in the kernel's task list
(tracer/core/thread_name.py) and the main thread by its id (the event loop runs there).
Then the proxy is left idle for `--idle-s` and what each thread spends a second is printed:
what the loop's clocks and the background threads cost with no request in flight.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # bench.lib and tracer, when run as `python bench/proxy_threads.py`

import proxy_overhead as po  # noqa: E402
from bench.lib.span_sink import span_sink  # noqa: E402
from bench.lib.stream_client import run_batch  # noqa: E402
from tracer.core.record_worker import OS_THREAD_NAME as WORKER_THREAD  # noqa: E402
from tracer.store.writer import OS_THREAD_NAME as STORE_THREAD  # noqa: E402

LOOP, OTHER = "event loop", "other threads"
GROUPS = (LOOP, WORKER_THREAD, STORE_THREAD, OTHER)


@dataclass
class ThreadTimes:
    cpu_ns: int
    wakes: int


def thread_times(pid: int) -> dict[str, ThreadTimes]:
    """CPU ns and voluntary switches of the process's threads so far, summed by group."""
    out = {group: ThreadTimes(0, 0) for group in GROUPS}
    for tid in os.listdir(f"/proc/{pid}/task"):
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{task}/schedstat") as f:
                cpu_ns = int(f.read().split()[0])
            with open(f"{task}/comm") as f:
                comm = f.read().strip()
            with open(f"{task}/status") as f:
                wakes = next(int(line.split()[1]) for line in f
                             if line.startswith("voluntary_ctxt_switches:"))
        except (OSError, StopIteration):   # a thread that ended meanwhile
            continue
        group = LOOP if int(tid) == pid else comm if comm in GROUPS else OTHER
        out[group].cpu_ns += cpu_ns
        out[group].wakes += wakes
    return out


def since(before: dict[str, ThreadTimes], after: dict[str, ThreadTimes]) -> dict[str, ThreadTimes]:
    # A thread that ended between the readings takes its count with it: never below zero.
    return {g: ThreadTimes(max(after[g].cpu_ns - before[g].cpu_ns, 0),
                           max(after[g].wakes - before[g].wakes, 0)) for g in GROUPS}


def start_proxy(args, tmp: Path, traces_url: str):
    """The fake upstream and one proxy, started as bench/proxy_overhead.py starts them."""
    upstream_port, upstream = po.start_upstream(args, tmp)
    port, proxy = po.start_proxy("proxy", upstream_port, args.concurrency, tmp,
                                 None if args.no_export else traces_url)
    return port, [proxy, upstream]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=64, help="content events per stream")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="between content events")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="streams per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--no-export", action="store_true", help="no OTLP exporter: no spans")
    args = parser.parse_args(argv)
    stream_s = args.chunks * args.gap_ms / 1e3
    stagger_s = stream_s / args.concurrency
    with tempfile.TemporaryDirectory(prefix="proxy-threads-") as tmp, \
            span_sink(Path(tmp)) as traces_url:
        port, processes = start_proxy(args, Path(tmp), traces_url)
        pid = processes[0].pid
        try:
            # A warm-up round: the lazily started threads (the record worker) exist after it.
            asyncio.run(run_batch(port, args.concurrency, args.concurrency * 2, stagger_s))
            totals = {g: ThreadTimes(0, 0) for g in GROUPS}
            num_requests, num_failed = 0, 0
            for _ in range(args.rounds):
                before = thread_times(pid)
                batch = asyncio.run(run_batch(port, args.concurrency, args.requests, stagger_s,
                                              stream_timeout_s=30 + 4 * stream_s))
                for g, t in since(before, thread_times(pid)).items():
                    totals[g].cpu_ns += t.cpu_ns
                    totals[g].wakes += t.wakes
                num_requests += len(batch.ttft_ms)
                num_failed += batch.num_failed
            before, start_s = thread_times(pid), time.monotonic()
            time.sleep(args.idle_s)   # the measured interval itself, not a synchronisation
            idle = since(before, thread_times(pid))
            idle_s = time.monotonic() - start_s
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=30)
    print(f"{args.rounds} rounds of {args.requests} streams at concurrency {args.concurrency}, "
          f"{args.chunks + 2} events each ({num_requests} completed, {num_failed} failed); "
          f"{'no exporter' if args.no_export else 'spans exported'}")
    print(f"{'thread':>16}  {'CPU us/request':>14}  {'wakes/request':>13}  {'idle CPU us/s':>13}")
    total_ns = sum(t.cpu_ns for t in totals.values())
    for g in GROUPS:
        print(f"{g:>16}  {totals[g].cpu_ns / max(num_requests, 1) / 1e3:14.1f}  "
              f"{totals[g].wakes / max(num_requests, 1):13.2f}  "
              f"{idle[g].cpu_ns / idle_s / 1e3:13.1f}")
    print(f"{'all':>16}  {total_ns / max(num_requests, 1) / 1e3:14.1f}")


if __name__ == "__main__":
    main()
