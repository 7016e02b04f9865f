"""vLLM's request span under the current GenAI conventions, and its cached-token count
(tracer/engines/vllm.py). The renamed span is built as vLLM builds it:
`latest_gen_ai_semconv_attributes("chat", model)` gives the name `"chat {model}"` and adds
`gen_ai.operation.name` / `gen_ai.request.model` beside the legacy attributes
(vllm-project/vllm tests/tracing/test_gen_ai_semconv.py at 2b1064819ee7)."""
from __future__ import annotations

import math

import pytest

from tracer.engines.detect import engine_timings
from tracer.engines.spans import SpanView

MODEL = "facebook/opt-125m"
LEGACY = {"gen_ai.latency.time_to_first_token": 0.30, "gen_ai.latency.time_in_queue": 0.10,
          "gen_ai.latency.time_in_model_prefill": 0.15, "gen_ai.usage.prompt_tokens": 64,
          "gen_ai.request.id": "chatcmpl-1"}
LATEST = {"gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL}


def _span(name: str, attrs: dict) -> SpanView:
    return SpanView("a" * 32, "b" * 16, "c" * 16, name, 1_000, attrs)


@pytest.mark.parametrize("name", ["llm_request", f"chat {MODEL}", "anything at all"])
def test_the_request_span_is_found_by_its_attributes_whatever_its_name(name):
    (_, timing), = engine_timings([_span(name, {**LEGACY, **LATEST})])
    assert (timing.source, timing.queue_ns, timing.prefill_ns, timing.ttft_ns) == (
        "vllm", 100_000_000, 150_000_000, 300_000_000)
    assert timing.num_prompt_tokens == 64


def test_the_name_alone_matches_nothing():
    assert engine_timings([_span(f"chat {MODEL}", LATEST)]) == []


def test_cached_tokens_are_read():
    (_, timing), = engine_timings([_span(f"chat {MODEL}",
                                         {**LEGACY, "gen_ai.usage.cached_tokens": 48})])
    assert timing.num_cached_tokens == 48


@pytest.mark.parametrize("cached", [-1, 65, 10**18, math.nan, 1.5, "48", True, None])
def test_a_cached_count_that_is_not_a_hit_within_the_prompt_is_absent(cached):
    attrs = {**LEGACY, "gen_ai.usage.cached_tokens": cached}
    (_, timing), = engine_timings([_span("llm_request", attrs)])
    assert timing.num_cached_tokens is None
    # The stages do not depend on it.
    assert (timing.queue_ns, timing.prefill_ns) == (100_000_000, 150_000_000)


def test_cached_tokens_without_a_prompt_count_are_absent():
    attrs = {k: v for k, v in LEGACY.items() if k != "gen_ai.usage.prompt_tokens"}
    (_, timing), = engine_timings([_span("llm_request", {**attrs,
                                                         "gen_ai.usage.cached_tokens": 8})])
    assert timing.num_cached_tokens is None
