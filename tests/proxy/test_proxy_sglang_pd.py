"""SGLang with prefill/decode disaggregation behind the proxy: both workers' spans, made by
the OpenTelemetry SDK as SGLang makes them (tracer/testing/sglang_spans.py), exported by the
SDK's `OTLPSpanExporter` to the proxy's receiver while the fake upstream streams the answer
(docs/architecture.md, "Inside the engine"). The record is the decode worker's request span
with the prefill worker's queue, prefill and kv_transfer; with the workers' spans in
separate exports it has no kv_transfer, and the prefill worker's span is no second claimant.
"""
from __future__ import annotations

from engine_support import EngineSdk, stream_through
from proxy_support import wait_until
from tracer.proxy.engine_join import JoinSettings
from tracer.testing.sglang_spans import PdTimeline, pd_request

DELAY = {"x-fake-first-token-delay-ms": "60"}
EXPECTING = JoinSettings(wait_s=30.0, spans_expected=True)
PROXY_FRONT = ["receive", "upstream_connect", "upstream_request", "tokenize"]
PROXY_BACK = ["engine_other", "upstream_response", "send"]


def _through_proxy(proxy, fake_upstream):
    stream_through(proxy.base_url, DELAY)
    seen = fake_upstream.state.requests[-1]
    assert wait_until(lambda: proxy.parts.join.num_pending == 1)
    return seen, seen.headers["traceparent"], seen.first_content_epoch_ns - seen.arrival_epoch_ns


def _record(proxy, traceparent: str):
    trace_id = traceparent.split("-")[1]
    assert wait_until(lambda: proxy.parts.obs.store.get(trace_id) is not None)
    record = proxy.parts.obs.store.get(trace_id)
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert all(a.end_ns == b.start_ns for a, b in zip(record.stages, record.stages[1:]))
    assert all(s.duration_ns >= 0 for s in record.stages)
    return record


def _count(proxy, outcome: str) -> float:
    return proxy.metric("llm_engine_timing_total", source="sglang", outcome=outcome)


def test_both_workers_in_one_export_give_queue_prefill_and_kv_transfer(proxy_factory,
                                                                     fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    # One SDK for both workers: their spans in one export, as an OpenTelemetry Collector's
    # groupbytrace processor in between delivers a trace.
    sdk = EngineSdk(proxy.base_url, service_name="sglang", batch=True)
    try:
        seen, traceparent, ttft_ns = _through_proxy(proxy, fake_upstream)
        pd_request(sdk.tracer, sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                   ttft_ns=ttft_ns, end_ns=seen.first_content_epoch_ns)
        sdk.flush()
        record = _record(proxy, traceparent)
        assert [s.stage for s in record.stages] == [
            *PROXY_FRONT, "queue", "prefill", "kv_transfer", *PROXY_BACK]
        expected = PdTimeline().stage_ns(ttft_ns)
        for stage, ns in expected.items():
            assert record.stage_ns(stage) == ns, stage
        attrs = record.attrs
        assert (attrs["llm.engine.source"], attrs["llm.engine.outcome"],
                attrs["llm.engine.placement"]) == ("sglang", "joined", "wall_clock")
        assert attrs["llm.engine.kv_transfer_ns"] == expected["kv_transfer"]
        assert attrs["llm.engine.ttft_ns"] == ttft_ns
        assert _count(proxy, "joined") == 1 and _count(proxy, "conflict_span") == 0
    finally:
        sdk.shutdown()


def test_workers_exporting_apart_join_the_decode_span_alone(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    prefill = EngineSdk(proxy.base_url, service_name="sglang", batch=True)
    decode = EngineSdk(proxy.base_url, service_name="sglang", batch=True)
    try:
        seen, traceparent, ttft_ns = _through_proxy(proxy, fake_upstream)
        pd_request(prefill.tracer, decode.tracer, traceparent,
                   arrival_ns=seen.arrival_epoch_ns, ttft_ns=ttft_ns,
                   end_ns=seen.first_content_epoch_ns)
        prefill.flush()   # the prefill worker's request ends first, and exports first
        decode.flush()
        record = _record(proxy, traceparent)
        # Its queue, prefill and transfer are not in the decode worker's export: they stay in
        # engine_other, never guessed; the prefill worker's span claims nothing.
        assert [s.stage for s in record.stages] == [*PROXY_FRONT, *PROXY_BACK]
        assert record.attrs["llm.engine.outcome"] == "joined"
        assert "llm.engine.kv_transfer_ns" not in record.attrs
        assert [_count(proxy, o) for o in ("joined", "conflict_span", "unmatched_span")] == [
            1, 0, 0]
    finally:
        prefill.shutdown()
        decode.shutdown()
