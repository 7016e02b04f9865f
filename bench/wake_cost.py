"""What waking a sleeping thread costs that thread's CPU: a timer's expiry against a notify.

    .venv/bin/python bench/wake_cost.py [--seconds 2] [--rounds 3]

The sidecar's threads sleep most of the time and wake for a record, a batch or a timer.
On a small VM a wake-up is not free, and the two kinds differ:

- **timer**: a thread waits on a condition with a timeout that expires (a worker's linger,
  a writer's flush interval, an event loop's `sleep`);
- **notify**: a thread waits on a condition until another thread notifies it (a record
  handed over).

Each kind runs for `--seconds` at several intervals, `--rounds` times interleaved; printed:
the median of the rounds of the waiting thread's CPU per wake-up (its
`/proc/self/task/TID/schedstat` run time, which counts what the kernel spends on it, else
`time.thread_time`), and the timer/notify ratio at the intervals both ran. An asyncio loop's
timer (`asyncio.sleep`, uvloop when installed) runs beside them: what a loop-lag watcher or a
server's tick costs a loop with nothing else to do.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

INTERVALS_S = (0.2, 0.05, 0.01, 0.001)


def thread_cpu_us() -> float:
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[0]) / 1e3
    except OSError:
        return time.thread_time() * 1e6


def in_thread(fn, *args) -> float:
    box = []
    thread = threading.Thread(target=lambda: box.append(fn(*args)))
    thread.start()
    thread.join()
    return box[0]


def timer_wake_us(interval_s: float, seconds: float) -> float:
    """CPU per expiry of a condition wait's timeout, on this thread."""
    cond, n = threading.Condition(), max(1, round(seconds / interval_s))
    start = thread_cpu_us()
    with cond:
        for _ in range(n):
            cond.wait(interval_s)
    return (thread_cpu_us() - start) / n


def notify_wake_us(interval_s: float, seconds: float) -> float:
    """CPU per wake-up of a thread waiting untimed, notified every `interval_s`."""
    cond, n = threading.Condition(), max(1, round(seconds / interval_s))
    state = {"sent": 0, "cpu": 0.0}
    ready = threading.Event()

    def waiter():
        with cond:
            ready.set()
            start, seen = thread_cpu_us(), 0
            while seen < n:
                while state["sent"] == seen:
                    cond.wait()
                seen = state["sent"]
            state["cpu"] = thread_cpu_us() - start

    thread = threading.Thread(target=waiter)
    thread.start()
    ready.wait()
    for _ in range(n):
        time.sleep(interval_s)
        with cond:
            state["sent"] += 1
            cond.notify()
    thread.join()
    return state["cpu"] / n


def loop_timer_wake_us(interval_s: float, seconds: float) -> float:
    """CPU per wake-up of an event loop that only sleeps `interval_s` at a time."""
    async def sleeper():
        n = max(1, round(seconds / interval_s))
        start = thread_cpu_us()
        for _ in range(n):
            await asyncio.sleep(interval_s)
        return (thread_cpu_us() - start) / n
    try:
        import uvloop
        return uvloop.run(sleeper())
    except ImportError:
        return asyncio.run(sleeper())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds = {"timer": timer_wake_us, "notify": notify_wake_us, "loop timer": loop_timer_wake_us}
    runs: dict[tuple[str, float], list[float]] = {}
    for _ in range(args.rounds):
        for interval_s in INTERVALS_S:
            for kind, fn in kinds.items():
                runs.setdefault((kind, interval_s), []).append(
                    in_thread(fn, interval_s, args.seconds))
    print(f"CPU per wake-up of the waking thread, µs (median of {args.rounds} rounds "
          f"of {args.seconds:g} s)")
    print(f"{'every':>8} " + " ".join(f"{kind:>11}" for kind in kinds) + "  timer/notify")
    for interval_s in INTERVALS_S:
        med = {kind: statistics.median(runs[kind, interval_s]) for kind in kinds}
        print(f"{interval_s * 1e3:>6g}ms " + " ".join(f"{med[k]:>11.1f}" for k in kinds)
              + f"  {med['timer'] / med['notify']:>11.2f}x")


if __name__ == "__main__":
    main()
