"""Issue 34, item 1: vLLM's per-request `metrics` in-band, so queue and prefill show with no
OTLP. The fake upstream writes the final usage chunk as vLLM's serving layer does with
`--enable-per-request-metrics` and `stream_options.include_usage` (`choices: []`, `usage`,
`metrics`; tracer/engines/vllm_metrics.py cites the source), the fields as
`build_per_request_timing_metrics` computes them. Hostile values must leave the stage sum
and every metric whole.
"""
from __future__ import annotations

import json
import math

import pytest

from engine_support import stream_through
from tracer.proxy.engine_join import JoinSettings
from tracer.record.stages import PROXY_STAGES

EXPECTING = JoinSettings(wait_s=30.0, spans_expected=True)
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}, "include_metrics": True}


def _through(proxy, fake_upstream, metrics: dict, delay_ms: int = 80):
    headers = {"x-fake-mode": "vllm_metrics", "x-fake-first-token-delay-ms": str(delay_ms),
               "x-fake-vllm-metrics": json.dumps(metrics)}
    response = stream_through(proxy.base_url, headers, body=BODY)
    assert response.status_code == 200
    # The client gets vLLM's chunk as vLLM sent it: the proxy reads it on the side.
    assert '"metrics":' in response.text
    proxy.wait_idle(timeout_s=5)       # in-band: published at once, never parked
    seen = fake_upstream.state.requests[-1]
    record = proxy.parts.obs.store.get(seen.headers["traceparent"].split("-")[1])
    assert record is not None
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert all(s.duration_ns >= 0 for s in record.stages)
    return record


def test_queue_and_prefill_from_the_usage_chunk(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    record = _through(proxy, fake_upstream, {
        "time_to_first_token_ms": 30.0, "generation_time_ms": 4.0, "queue_time_ms": 20.5,
        "mean_itl_ms": 0.8, "tokens_per_second": 150.0})
    assert [s.stage for s in record.stages] == [
        "receive", "upstream_connect", "upstream_other", "queue", "prefill", "send"]
    assert record.stage_ns("queue") == 20_500_000
    assert record.stage_ns("prefill") == 30_000_000
    assert record.attrs["llm.engine.source"] == "vllm"
    assert record.attrs["llm.engine.placement"] == "end_anchored"
    assert record.num_prompt_tokens == 5            # the usage of the same chunk
    assert proxy.metric("llm_engine_timing_total", source="vllm", outcome="joined") == 1
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="queue") == 1
    assert proxy.parts.join.num_pending == 0


@pytest.mark.parametrize("metrics", [
    {"queue_time_ms": -5.0, "time_to_first_token_ms": 10.0},            # negative
    {"queue_time_ms": "20", "time_to_first_token_ms": 10.0},            # a string
    {"queue_time_ms": True, "time_to_first_token_ms": 10.0},            # a bool
    {"queue_time_ms": None, "time_to_first_token_ms": 10.0},            # null (unknown)
    {"time_to_first_token_ms": 10.0},                                   # missing
    {"queue_time_ms": 1e300, "time_to_first_token_ms": 10.0},           # past a day
])
def test_a_hostile_field_is_unknown_and_the_rest_still_places(proxy_factory, fake_upstream,
                                                              metrics):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    record = _through(proxy, fake_upstream, metrics)
    assert [s.stage for s in record.stages] == [
        "receive", "upstream_connect", "upstream_other", "prefill", "send"]
    assert record.stage_ns("prefill") == 10_000_000
    assert "llm.engine.queue_ns" not in record.attrs


def test_a_prefill_longer_than_the_window_is_inconsistent(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    record = _through(proxy, fake_upstream, {"queue_time_ms": 3_600_000.0,
                                             "time_to_first_token_ms": 10.0})
    assert [s.stage for s in record.stages] == list(PROXY_STAGES)
    assert record.attrs["llm.engine.placement"] == "inconsistent"
    assert record.attrs["llm.engine.rejection_detail"].startswith(
        "vllm: queue + prefill 3600010 ms exceed the ")
    assert proxy.metric("llm_engine_timing_rejected_total", source="vllm",
                        reason="exceeds_window") == 1
    # The histogram saw the proxy's stages, not an hour of queue.
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="queue") == 0
    assert proxy.metric("llm_request_stage_duration_seconds_sum", stage="queue") == 0


@pytest.mark.parametrize("metrics", [
    {}, {"queue_time_ms": None, "time_to_first_token_ms": None},
    {"queue_time_ms": math.nan}, {"queue_time_ms": [1]}, [1, 2], "fast"])
def test_metrics_with_nothing_usable_are_no_signal(proxy_factory, fake_upstream, metrics):
    """vLLM sends `metrics: {}` when it knows no timestamp; nothing usable is not a join,
    so the record still waits for the engine's span."""
    proxy = proxy_factory(fake_upstream.base_url, join=JoinSettings(wait_s=0.2,
                                                                    spans_expected=True))
    headers = {"x-fake-mode": "vllm_metrics",
               "x-fake-vllm-metrics": json.dumps(metrics, allow_nan=True)}
    assert stream_through(proxy.base_url, headers, body=BODY).status_code == 200
    proxy.wait_idle()
    assert proxy.metric("llm_engine_timing_total", source="none", outcome="timeout") == 1
    assert proxy.metric("llm_engine_timing_total", source="vllm", outcome="joined") == 0


def test_responses_completed_carries_the_metrics_too():
    """`/v1/responses`: the final `response.completed` event's response object."""
    from tracer.engines import vllm_metrics
    from tracer.proxy.formats import FormatScanner
    scanner = FormatScanner("openai-responses")
    completed = {"type": "response.completed", "response": {
        "object": "response", "status": "completed",
        "usage": {"input_tokens": 5, "output_tokens": 2},
        "metrics": {"queue_time_ms": 2.0, "time_to_first_token_ms": 7.0}}}
    scanner.feed(b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n")
    assert scanner.summary.done
    timing = vllm_metrics.timing_of(scanner.summary.metrics)
    assert (timing.queue_ns, timing.prefill_ns) == (2_000_000, 7_000_000)
