"""How the tracer's worker hands the GIL to a waiting thread between records, and its CPU.

    .venv/bin/python bench/gil_handoff.py [--samples 1000] [--record-us 100]

A thread stands in for the tracer's worker: it runs `--record-us` of Python (one record),
then the hand-off, again and again. The main thread stands in for the event loop: it sleeps
1 ms (waiting for a socket), then needs the GIL; the delay past the 1 ms is how long the
worker kept it. Printed per hand-off: the wake delay's p50/p90/p99, and the hand-off's own
CPU per call, measured alone (for the gated one: per record, back to back).
`sleep(0) every >= 200 µs` is what tracer/core/record_worker.py does (YIELD_EVERY_NS);
`none` is no hand-off: the loop waits for the 5 ms switch interval.
"""
from __future__ import annotations

import argparse
import os
import threading
import time



def gated(every_ns: int):
    """sleep(0) once `every_ns` has passed since the last (the worker's YIELD_EVERY_NS)."""
    last = [0]

    def handoff():
        now = time.perf_counter_ns()
        if now - last[0] >= every_ns:
            time.sleep(0)
            last[0] = time.perf_counter_ns()
    return handoff


HANDOFFS = {"sleep(0)": lambda: time.sleep(0),
            "sleep(0) every >= 200 µs": gated(200_000),
            "sched_yield": os.sched_yield, "none": lambda: None}


def wake_delays_us(handoff, samples: int, record_ns: int) -> list[float]:
    stop = False

    def worker():
        while not stop:
            t = time.perf_counter_ns()
            while time.perf_counter_ns() - t < record_ns:
                pass
            handoff()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    delays = []
    for _ in range(samples):
        t = time.perf_counter_ns()
        time.sleep(0.001)
        delays.append((time.perf_counter_ns() - t - 1_000_000) / 1e3)
    stop = True
    thread.join()
    return sorted(delays)


def cpu_ns_per_call(handoff, n: int = 20_000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.thread_time_ns()
        for _ in range(n):
            handoff()
        best = min(best, (time.thread_time_ns() - start) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--record-us", type=int, default=100)
    args = parser.parse_args()
    for name, handoff in HANDOFFS.items():
        d = wake_delays_us(handoff, args.samples, args.record_us * 1000)
        pick = lambda q: d[min(len(d) - 1, int(q * len(d)))]  # noqa: E731
        print(f"{name:26s} wake delay p50 {pick(0.5):7.0f} µs  p90 {pick(0.9):7.0f} µs  "
              f"p99 {pick(0.99):7.0f} µs; {cpu_ns_per_call(handoff) / 1e3:6.2f} µs CPU a call")


if __name__ == "__main__":
    main()
