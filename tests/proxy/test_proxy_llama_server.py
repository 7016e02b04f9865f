"""llama.cpp's native `llama-server` behind the proxy, for real: its `timings` become the
record's `prefill`, and its slot's prompt cache shows as `cache=hit` with a shorter prefill.

The binary and how it runs: `proxy_support.running_llama_server`.
"""
from __future__ import annotations


import pytest

from proxy_support import running_llama_server, start_proxy, stream_timings
from tracer.proxy.cli import discover_model_names
from tracer.record.labels import cache_outcome

# make test runs the tests marked llama_server last, once llama-server is built (Makefile).
pytestmark = pytest.mark.llama_server

# ~400 prompt tokens shared by both requests: the slot keeps them cached between the two.
SYSTEM = ("You are a terse assistant for a railway timetable office. " * 40).strip()


@pytest.fixture(scope="module")
def llama_server():
    with running_llama_server() as base_url:
        yield base_url


def _ask(base_url: str, model: str, question: str) -> tuple[dict, str]:
    """Stream one chat completion; the `timings` of its last chunk and the trace id."""
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "cache_prompt": True,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}]}
    return stream_timings(base_url, body)


def test_prefill_is_prompt_ms_and_a_prefix_hit_is_shorter(llama_server):
    names = discover_model_names(llama_server, timeout_s=10)
    proxy = start_proxy(llama_server, names)
    try:
        records = []
        for question in ("Which platform for the 9:15?", "Which platform for the 10:40?"):
            timings, trace_id = _ask(proxy.base_url, names[0], question)
            proxy.wait_idle(timeout_s=30)
            record = proxy.parts.obs.store.get(trace_id)
            assert record.attrs["llm.engine.source"] == "llamacpp", record.attrs
            assert abs(record.stage_ns("prefill") - timings["prompt_ms"] * 1e6) <= 1e6
            assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
            assert [s.stage for s in record.stages] == [
                "receive", "upstream_connect", "upstream_other", "prefill", "send"]
            records.append((record, timings))
        (cold, cold_timings), (warm, warm_timings) = records
        assert cold_timings["cache_n"] < warm_timings["cache_n"]
        assert warm.num_cached_tokens == warm_timings["cache_n"]
        assert cache_outcome(warm.num_prompt_tokens, warm.num_cached_tokens) == "hit"
        assert warm.stage_ns("prefill") < cold.stage_ns("prefill")
        assert proxy.metric("llm_ttft_by_cache_seconds_count", model=names[0], cache="hit") == 1
        assert proxy.metric("llm_engine_timing_total", source="llamacpp", outcome="joined") == 2
    finally:
        proxy.app.stop()
