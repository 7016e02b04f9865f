"""Event-loop lag: how late the asyncio loop runs a timer, as `llm_event_loop_lag_seconds`.

Every request's `receive` and `send` stages run on the loop, so when something blocks it (a
synchronous tokenizer call, a thread holding the GIL, a starved CPU) every request waits
that long: the "high TTFT, idle GPU" case. A small task sleeps `interval_s` again and again
and records how much later than asked it woke (docs/reference.md, "Metrics").

Both fronts start it in their lifespan and cancel it in the lifespan's `finally`; it is a
plain asyncio task, so it never keeps a process alive on its own.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

TASK_NAME = "ttftscope.loop_lag"
# Four samples a second. Sampled evenly in time, the lag's distribution is the same at any
# rate: a stall of 0.25 s or more is always seen, a shorter one in proportion to its length,
# and a 15 s scrape holds 60 samples. Each sample is a wake-up of its own, 100-200 µs of CPU
# on a small VM (bench/wake_cost.py): at 0.1 s the watcher cost the proxy ~0.3 ms a request
# at a few requests a second (docs/figures.md,
# "The proxy against nginx (AVX-512 machine, quiet)").
DEFAULT_INTERVAL_S = 0.25


async def watch_loop_lag(observe: Callable[[float], None], *,
                         interval_s: float = DEFAULT_INTERVAL_S,
                         clock: Callable[[], float] = time.perf_counter,
                         sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """Forever: sleep `interval_s`, then `observe(actual − asked)` in seconds (≥ 0)."""
    if not interval_s > 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    while True:
        before_s = clock()
        await sleep(interval_s)
        observe(max(clock() - before_s - interval_s, 0.0))


def start_loop_lag(metrics, *, interval_s: float = DEFAULT_INTERVAL_S) -> asyncio.Task:
    """The running watcher feeding `metrics.observe_loop_lag`; cancel it on shutdown.

    Call from inside the running loop (a lifespan).
    """
    return asyncio.get_running_loop().create_task(
        watch_loop_lag(metrics.observe_loop_lag, interval_s=interval_s), name=TASK_NAME)
