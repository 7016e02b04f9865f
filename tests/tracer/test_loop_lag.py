"""The event-loop lag watcher: what it measures, that it sees a blocked loop, and that the
fronts' lifespans start it and leave no task behind."""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.sinks.metrics import LLMMetrics
from tracer.web.loop_lag import TASK_NAME, start_loop_lag, watch_loop_lag


class _Stop(Exception):
    pass


def test_lag_is_actual_minus_asked_never_negative():
    now, lags_s, observed = [100.0], [0.0, 0.05, 0.2, -0.001], []

    async def fake_sleep(interval_s):
        if not lags_s:
            raise _Stop
        now[0] += interval_s + lags_s.pop(0)

    with pytest.raises(_Stop):
        asyncio.run(watch_loop_lag(observed.append, interval_s=0.1, clock=lambda: now[0],
                                   sleep=fake_sleep))
    assert observed == pytest.approx([0.0, 0.05, 0.2, 0.0])


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        asyncio.run(watch_loop_lag(lambda s: None, interval_s=0))


def _lag(registry: CollectorRegistry, suffix: str) -> float:
    return registry.get_sample_value("llm_event_loop_lag_seconds" + suffix) or 0.0


def test_a_blocked_loop_shows_up_and_cancel_leaves_no_task():
    registry = CollectorRegistry()
    metrics = LLMMetrics(registry, model_names=["m"])

    async def scenario():
        task = start_loop_lag(metrics, interval_s=0.01)
        assert task.get_name() == TASK_NAME
        deadline_s = time.monotonic() + 10
        while _lag(registry, "_count") < 1:   # the watcher runs
            assert time.monotonic() < deadline_s, "the watcher never observed"
            await asyncio.sleep(0.005)
        spin_until_s = time.perf_counter() + 0.08
        while time.perf_counter() < spin_until_s:   # hold the loop: the load under test
            pass
        while _max_bucket_hit(registry) < 0.05:
            assert time.monotonic() < deadline_s, "the blocked loop was not seen"
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert not [t for t in asyncio.all_tasks() if t.get_name() == TASK_NAME]

    asyncio.run(scenario())


def _max_bucket_hit(registry: CollectorRegistry) -> float:
    """The largest bucket edge below which not every observation lies: a lower bound on the
    largest observed lag."""
    count = _lag(registry, "_count")
    edges = [s for f in registry.collect() if f.name == "llm_event_loop_lag_seconds"
             for s in f.samples if s.name.endswith("_bucket")]
    below = [float(s.labels["le"]) for s in edges if s.value < count]
    return max(below, default=0.0)


def test_the_proxy_lifespan_starts_the_watcher_and_cancels_it():
    registry = CollectorRegistry()
    parts = create_proxy_app(ProxySettings("http://127.0.0.1:9", upstream_metrics_path=None),
                             model_names=("m",), registry=registry)
    app = parts.app

    async def scenario():
        messages = asyncio.Queue()
        await messages.put({"type": "lifespan.startup"})
        sent = []

        async def receive():
            return await messages.get()

        async def send(message):
            sent.append(message["type"])

        server = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"},
                                          "state": {}}, receive, send))
        deadline_s = time.monotonic() + 10
        while "lifespan.startup.complete" not in sent:
            assert time.monotonic() < deadline_s and not server.done(), sent
            await asyncio.sleep(0.005)
        (watcher,) = [t for t in asyncio.all_tasks() if t.get_name() == TASK_NAME]
        while _lag(registry, "_count") < 1:
            assert time.monotonic() < deadline_s, "no lag observed while serving"
            await asyncio.sleep(0.005)
        await messages.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(server, 10)
        assert "lifespan.shutdown.complete" in sent
        while not watcher.done():
            assert time.monotonic() < deadline_s, "the watcher outlived the lifespan"
            await asyncio.sleep(0.005)
        assert watcher.cancelled()

    asyncio.run(scenario())
