"""Token counts through the proxy (issue 39, break 8): an engine span that says
`gen_ai.usage.prompt_tokens = 2^63 − 1` joins its record, and the count is left out of
`llm_prompt_tokens_total`, kept on the record marked invalid, and counted."""
from __future__ import annotations

import httpx

from engine_support import stream_through
from tracer.proxy.engine_join import JoinSettings

DELAY = {"x-fake-first-token-delay-ms": "40"}


def test_an_engine_span_claiming_2_63_prompt_tokens_adds_nothing(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=JoinSettings(wait_s=30, spans_expected=True))
    stream_through(proxy.base_url, DELAY)
    seen = fake_upstream.state.requests[-1]
    trace_id, span_id = seen.headers["traceparent"].split("-")[1:3]
    ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
    attributes = [
        {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": ttft_s}},
        {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": ttft_s / 5}},
        {"key": "gen_ai.latency.time_in_model_prefill", "value": {"doubleValue": ttft_s / 2}},
        {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": str(2**63 - 1)}}]
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": trace_id, "spanId": "00f067aa0ba902b7", "parentSpanId": span_id,
        "name": "llm_request", "kind": 2, "startTimeUnixNano": str(seen.arrival_epoch_ns),
        "endTimeUnixNano": str(seen.first_content_epoch_ns), "attributes": attributes}]}]}]}
    assert httpx.post(proxy.base_url + "/v1/traces", json=body).status_code == 200
    proxy.wait_idle()
    record = proxy.parts.obs.store.get(trace_id)
    assert record.attrs.get("llm.engine.outcome") == "joined"   # the span was read
    assert record.num_prompt_tokens == 0
    assert record.attrs["llm.invalid_tokens.prompt"] == str(2**63 - 1)
    assert proxy.metric("llm_prompt_tokens_total", model=record.model) == 0
    assert proxy.metric("llm_invalid_token_counts_total", kind="prompt") == 1
    assert proxy.parts.obs.tracer.sink_failures == {}


def test_llama_cpp_timings_with_a_negative_cache_n_lose_no_record(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    response = stream_through(proxy.base_url, {"x-fake-mode": "llamacpp", "x-fake-cache-n": "-5"})
    assert response.status_code == 200
    proxy.wait_idle()
    trace_id = fake_upstream.state.requests[-1].headers["traceparent"].split("-")[1]
    record = proxy.parts.obs.store.get(trace_id)
    assert record is not None and record.num_cached_tokens == 0
    assert record.attrs["llm.invalid_tokens.cached"] == "-5"
    assert proxy.metric("llm_invalid_token_counts_total", kind="cached") == 1
    assert proxy.metric("llm_prompt_cached_tokens_total", model=record.model) == 0
    assert proxy.parts.obs.tracer.sink_failures == {}   # the metrics sink did not raise
