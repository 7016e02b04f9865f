"""Issue 34, item 7: an engine span that comes after its record was published is not lost.

The record went out without it (`no_signal`: no engine span had been seen yet, so the first
request does not wait; or `timeout`). When the span under the request's secret parent comes,
the trace store's copy takes the engine's stages (`llm.engine.outcome = late`), counted as
`late`; the metrics keep what they observed. The spans are vLLM's `llm_request` as the
tracer.testing helpers build it from vLLM's source (tracer/engines/vllm.py cites it), sent
as OTLP/HTTP protobuf to the proxy's receiver, as the engine's exporter does.
"""
from __future__ import annotations

import os

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from engine_support import stream_through
from proxy_support import wait_until
from tracer.proxy.engine_join import JoinSettings
from tracer.record.stages import PROXY_STAGES
from tracer.testing.fake_upstream import MODEL

DELAY = {"x-fake-first-token-delay-ms": "60"}


def _vllm_span(seen, *, queue_part: float = 0.25, span_id: bytes | None = None,
               parent: str | None = None) -> Span:
    """The `llm_request` span of the request `seen` by the upstream: its arrival, its TTFT
    (arrival → first content), a queue and a prefill inside it."""
    trace_id, secret = seen.headers["traceparent"].split("-")[1:3]
    ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9

    def number(key, value):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return Span(trace_id=bytes.fromhex(trace_id), span_id=span_id or os.urandom(8),
                parent_span_id=bytes.fromhex(parent or secret), name="llm_request",
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=seen.arrival_epoch_ns,
                end_time_unix_nano=seen.first_content_epoch_ns + 1_000_000,
                attributes=[number("gen_ai.latency.time_to_first_token", ttft_s),
                            number("gen_ai.latency.time_in_queue", ttft_s * queue_part),
                            number("gen_ai.latency.time_in_model_prefill", ttft_s / 2),
                            KeyValue(key="gen_ai.usage.prompt_tokens",
                                     value=AnyValue(int_value=23))])


def _post(proxy, spans: list[Span]) -> None:
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()
    answer = httpx.post(proxy.base_url + "/v1/traces", content=body,
                        headers={"content-type": "application/x-protobuf"})
    assert answer.status_code == 200


def _count(proxy, outcome: str, source: str = "vllm") -> float:
    return proxy.metric("llm_engine_timing_total", source=source, outcome=outcome)


def _published(proxy, fake_upstream):
    """One streamed request through the proxy, published: (what the upstream saw, record)."""
    stream_through(proxy.base_url, DELAY)
    proxy.wait_idle()
    seen = fake_upstream.state.requests[-1]
    record = proxy.parts.obs.store.get(seen.headers["traceparent"].split("-")[1])
    assert record is not None
    assert [s.stage for s in record.stages] == list(PROXY_STAGES)
    return seen, record


def test_the_first_request_gets_its_late_span_in_the_store(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)   # no engine span seen: nobody waits
    seen, before = _published(proxy, fake_upstream)
    assert _count(proxy, "no_signal", source="none") == 1
    ttft_count = proxy.metric("gen_ai_server_time_to_first_token_seconds_count",
                              gen_ai_request_model=MODEL, gen_ai_operation_name="chat")
    assert ttft_count == 1

    _post(proxy, [_vllm_span(seen)])
    assert wait_until(lambda: _count(proxy, "late") == 1)
    after = proxy.parts.obs.store.get(before.trace_id)
    assert after is not before and after.request_id == before.request_id
    assert [s.stage for s in after.stages] == [
        "receive", "upstream_connect", "upstream_request", "queue", "prefill",
        "engine_other", "upstream_response", "send"]
    ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
    assert after.stage_ns("queue") == round(ttft_s * 0.25 * 1e9)
    # The stages still tile the proxy's TTFT exactly: nothing moved but the split.
    assert sum(s.duration_ns for s in after.stages) == after.ttft_ns == before.ttft_ns
    assert all(a.end_ns == b.start_ns for a, b in zip(after.stages, after.stages[1:]))
    assert after.attrs["llm.engine.outcome"] == "late"
    assert after.attrs["llm.engine.placement"] == "wall_clock"
    assert after.num_prompt_tokens == 23          # the stream said none; the span did
    # The record the metrics saw is untouched and nothing was observed again.
    assert [s.stage for s in before.stages] == list(PROXY_STAGES)
    assert "llm.engine.source" not in before.attrs
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="queue") == 0
    assert proxy.metric("gen_ai_server_time_to_first_token_seconds_count",
                        gen_ai_request_model=MODEL, gen_ai_operation_name="chat") == 1
    assert _count(proxy, "unmatched_span") == 0 and _count(proxy, "joined") == 0
    # `/ui` lists what the store holds: the updated copy.
    assert proxy.parts.obs.store.recent(1)[0] is after


def test_a_record_that_timed_out_takes_its_span_late_once(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url,
                          join=JoinSettings(wait_s=0.2, spans_expected=True))
    seen, before = _published(proxy, fake_upstream)      # waited 0.2 s: timeout
    assert before.attrs["llm.engine.outcome"] == "timeout"
    span = _vllm_span(seen)
    _post(proxy, [span])
    assert wait_until(lambda: _count(proxy, "late") == 1)
    assert proxy.parts.obs.store.get(before.trace_id).attrs["llm.engine.outcome"] == "late"
    # Once: the same span again is a duplicate, another one a conflict; neither rewrites it.
    _post(proxy, [span])
    assert wait_until(lambda: _count(proxy, "duplicate_span") == 1)
    late = proxy.parts.obs.store.get(before.trace_id)
    _post(proxy, [_vllm_span(seen, queue_part=0.1)])
    assert wait_until(lambda: _count(proxy, "conflict_span") == 1)
    assert proxy.parts.obs.store.get(before.trace_id) is late
    assert _count(proxy, "late") == 1 and _count(proxy, "unmatched_span") == 0


def test_only_the_secret_parent_joins_late(proxy_factory, fake_upstream):
    """The span id the client saw (`Server-Timing`) is the record's own, not the secret:
    a span under it after publication still changes nothing."""
    proxy = proxy_factory(fake_upstream.base_url)
    seen, before = _published(proxy, fake_upstream)
    _post(proxy, [_vllm_span(seen, parent=before.span_id)])
    assert wait_until(lambda: _count(proxy, "unmatched_span") == 1)
    assert proxy.parts.obs.store.get(before.trace_id) is before
    assert _count(proxy, "late") == 0


def test_only_the_last_max_pending_records_are_remembered(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=JoinSettings(max_pending=1))
    old_seen, old = _published(proxy, fake_upstream)
    new_seen, new = _published(proxy, fake_upstream)
    _post(proxy, [_vllm_span(old_seen)])                   # forgotten: bounded memory
    assert wait_until(lambda: _count(proxy, "unmatched_span") == 1)
    assert proxy.parts.obs.store.get(old.trace_id) is old
    _post(proxy, [_vllm_span(new_seen)])
    assert wait_until(lambda: _count(proxy, "late") == 1)
    assert proxy.parts.obs.store.get(new.trace_id).attrs["llm.engine.outcome"] == "late"
