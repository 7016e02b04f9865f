"""Readiness: with a warm-up, /health answers 503 until it is done, completions are refused
before tracing meanwhile, the warm-up leaves no trace of a user request, and the load and
warm-up times are gauges."""
from __future__ import annotations

import threading
import time

import httpx
from prometheus_client import CollectorRegistry

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.server.app import ServerSettings, create_app

CHAT = {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}


def wait_until(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)   # polling a condition with a deadline
    return False


def ttft_count(live) -> float:
    return live.parts.obs.registry.get_sample_value(
        "gen_ai_server_time_to_first_token_seconds_count",
        {"gen_ai_request_model": live.model, "gen_ai_operation_name": "chat"})


def request_spans(live) -> list:
    return [s for s in live.spans.get_finished_spans()
            if s.name.startswith("chat ") or s.name.startswith("llm.")]


def test_not_ready_until_the_warm_up_is_done_and_the_warm_up_is_no_request(
        server_factory, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    real_warm_up = LLMEngine.warm_up

    def gated_warm_up(self, **kwargs):
        entered.set()
        assert gate.wait(60), "the test never opened the gate"
        return real_warm_up(self, **kwargs)
    monkeypatch.setattr(LLMEngine, "warm_up", gated_warm_up)
    live = server_factory(ServerSettings(warm_up=True))
    try:
        assert entered.wait(30), "the step thread did not start the warm-up"
        health = httpx.get(live.base_url + "/health")
        assert health.status_code == 503 and health.json() == {"status": "warming_up"}
        assert health.headers["retry-after"] == "1"
        refused = httpx.post(live.base_url + "/v1/chat/completions",
                             json={"model": live.model, **CHAT})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "engine_warming_up"
        assert refused.json()["error"]["type"] == "server_error"
        bad = httpx.post(live.base_url + "/v1/chat/completions", json={"model": live.model})
        assert bad.status_code == 400          # bad input is still answered as such
        metrics = httpx.get(live.base_url + "/metrics").text
        assert "llm_model_warmup_seconds" not in metrics   # unknown yet: absent, not zero
    finally:
        gate.set()
    assert wait_until(lambda: httpx.get(live.base_url + "/health").status_code == 200)
    assert httpx.get(live.base_url + "/health").json() == {"status": "ok"}
    warmup_s = live.parts.obs.registry.get_sample_value("llm_model_warmup_seconds",
                                                        {"model": live.model})
    assert warmup_s is not None and warmup_s > 0
    assert warmup_s == live.engine.warmup_s
    # The warm-up ran through the engine, yet nobody's request was recorded.
    assert live.parts.obs.store.recent(100) == []
    assert ttft_count(live) == 0
    assert request_spans(live) == []
    assert live.engine.block_manager.num_used_blocks == 0

    served = httpx.post(live.base_url + "/v1/chat/completions",
                        json={"model": live.model, **CHAT}, timeout=60)
    assert served.status_code == 200
    live.wait_idle()
    # Sinks may run after the request is done: poll, then check nothing more came.
    assert wait_until(lambda: len(live.parts.obs.store.recent(100)) == 1
                      and ttft_count(live) == 1 and len(request_spans(live)) >= 2)
    assert {s.name for s in request_spans(live)} >= {f"chat {live.model}", "llm.prefill"}
    assert len(live.parts.obs.store.recent(100)) == 1 and ttft_count(live) == 1


def test_without_warm_up_the_server_is_ready_at_once(live):
    assert httpx.get(live.base_url + "/health").status_code == 200
    assert live.parts.obs.registry.get_sample_value(
        "llm_model_warmup_seconds", {"model": live.model}) is None


def test_model_load_time_is_a_gauge_when_known(loaded_model):
    timed = LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model, model_load_s=1.25)
    registry = CollectorRegistry()
    create_app(timed, registry=registry)
    assert registry.get_sample_value("llm_model_load_seconds",
                                     {"model": timed.model_name}) == 1.25
    untimed = LLMEngine(EngineConfig(num_kv_blocks=16), loaded=loaded_model)
    registry = CollectorRegistry()
    create_app(untimed, registry=registry)
    assert registry.get_sample_value("llm_model_load_seconds",
                                     {"model": untimed.model_name}) is None
