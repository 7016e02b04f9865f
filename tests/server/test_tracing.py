"""For a real request: one `chat {model}` span, nine contiguous stage children summing to TTFT,
in the caller's trace; prefix-cache hits visible in the span and the counters."""
from __future__ import annotations

import secrets

import httpx
import pytest
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from instrumented_engine.server.app import ServerSettings
from tracer.record.stages import SERVER_STAGES
from tracer.record.traceparent import parse_server_timing, parse_traceparent


def traced_post(live, body: dict) -> tuple[httpx.Response, str, str]:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    r = httpx.post(live.base_url + "/v1/chat/completions", json=body,
                   headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}, timeout=60)
    assert r.status_code == 200, r.text
    return r, trace_id, parent_id


def spans_of(live, trace_id: str):
    return [s for s in live.spans.get_finished_spans()
            if f"{s.context.trace_id:032x}" == trace_id]


def test_nine_contiguous_stage_spans_sum_to_ttft(live):
    body = {"model": live.model, "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello in Chinese: 你好"}]}
    with httpx.stream("POST", live.base_url + "/v1/chat/completions", json=body,
                      headers={"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}) as r:
        server_tp = parse_traceparent(parse_server_timing(r.headers["server-timing"]))
        list(r.iter_lines())
    trace_id = "ab" * 16
    spans = spans_of(live, trace_id)
    server = [s for s in spans if s.name == f"chat {live.model}"]
    assert len(server) == 1
    server = server[0]
    assert server_tp.trace_id == trace_id
    assert f"{server.context.span_id:016x}" == server_tp.span_id
    stages = sorted((s for s in spans if s.parent and s.parent.span_id == server.context.span_id
                     and s.name.startswith("llm.")), key=lambda s: s.start_time)
    assert [s.name for s in stages] == [f"llm.{stage}" for stage in SERVER_STAGES]
    for before, after in zip(stages, stages[1:]):
        assert before.end_time == after.start_time
    assert all(s.end_time >= s.start_time for s in stages)
    record = live.parts.obs.store.get(trace_id)
    assert record is not None and record.unattributed_ns == 0
    assert sum(s.duration_ns for s in record.stages) == record.ttft_ns
    assert stages[-1].end_time - stages[0].start_time == record.ttft_ns
    assert server.attributes["gen_ai.usage.output_tokens"] == 4


@pytest.mark.parametrize("http_spans", [False, True])
def test_incoming_trace_is_continued_with_one_server_span(live, server_factory, http_spans):
    server = server_factory(ServerSettings(http_spans=True)) if http_spans else live
    body = {"model": server.model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}]}
    r, trace_id, parent_id = traced_post(server, body)
    tp = parse_traceparent(parse_server_timing(r.headers["server-timing"]))
    assert tp.trace_id == trace_id
    server.wait_idle()
    spans = {s.name: s for s in spans_of(server, trace_id)}
    chat_span = spans[f"chat {server.model}"]
    assert f"{chat_span.context.span_id:016x}" == tp.span_id
    # One SERVER span for the hop, continuing the caller's: the FastAPI instrumentation's
    # HTTP span with `http_spans`, else ours (the default, as in the proxy).
    hop = spans["POST /v1/chat/completions"] if http_spans else chat_span
    assert [s for s in spans.values() if s.kind is SpanKind.SERVER] == [hop]
    assert f"{hop.parent.span_id:016x}" == parent_id
    if http_spans:
        assert chat_span.kind is SpanKind.INTERNAL
        assert chat_span.parent.span_id == hop.context.span_id


def cached_tokens_total(live) -> float:
    text = httpx.get(live.base_url + "/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "llm_prompt_cached_tokens":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("llm_prompt_cached_tokens_total missing")


def test_prefix_cache_hit_in_kv_lookup_span_and_counter(live):
    system = "You are a careful assistant who answers briefly and precisely. " * 6
    body = {"model": live.model, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "Hello?"}]}
    before = cached_tokens_total(live)
    traced_post(live, body)
    r, trace_id, _ = traced_post(live, body)
    kv = [s for s in spans_of(live, trace_id) if s.name == "llm.kv_lookup"]
    assert len(kv) == 1
    hit_tokens = kv[0].attributes["llm.num_hit_tokens"]
    assert hit_tokens >= 64 and hit_tokens % 16 == 0
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == hit_tokens
    assert cached_tokens_total(live) - before == hit_tokens
