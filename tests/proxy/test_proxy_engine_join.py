"""The proxy's engine join with real parts: spans made with the OpenTelemetry SDK exactly as
vLLM, SGLang and TensorRT-LLM make them, exported by the SDK's `OTLPSpanExporter` over HTTP
to the proxy's receiver, while the fake upstream streams the completion; llama.cpp's
`timings` and TGI's headers in-band (docs/architecture.md, "Inside the engine").

Each test fails without its adapter (no `joined`, no engine stages) or without the join
(the record would be published before its span, or never).
"""
from __future__ import annotations

import gzip

import pytest

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from engine_support import EngineSdk, stream_through
from proxy_support import wait_until
from tracer.proxy.engine_join import JoinSettings
from tracer.record.stages import PROXY_STAGES
from tracer.testing.engine_spans import sglang_spans, tgi_spans, trtllm_span, vllm_span
from tracer.testing.otlp_sink import OtlpSink

DELAY = {"x-fake-first-token-delay-ms": "60"}
EXPECTING = JoinSettings(wait_s=30.0, spans_expected=True)
GRPC = {"otlp_grpc_listen": "127.0.0.1:0"}
TRANSPORTS = pytest.mark.parametrize("transport", ["http", "grpc"])


def _sdk(proxy, transport: str, **kwargs) -> EngineSdk:
    port = proxy.parts.otlp_grpc.port if transport == "grpc" else None
    return EngineSdk(proxy.base_url, grpc_port=port, **kwargs)


def _parked(proxy, num: int = 1) -> None:
    assert wait_until(lambda: proxy.parts.join.num_pending == num), proxy.parts.join.num_pending


def _record(proxy, trace_id: str):
    proxy.wait_idle()
    record = proxy.parts.obs.store.get(trace_id)
    assert record is not None
    return record


def _upstream_view(fake_upstream):
    seen = fake_upstream.state.requests[-1]
    assert seen.first_content_epoch_ns > seen.arrival_epoch_ns > 0
    return seen, seen.headers["traceparent"]


def _stages(record) -> list[str]:
    engine = str({k: v for k, v in record.attrs.items() if k.startswith("llm.engine")})
    assert "llm.engine.source" in record.attrs, engine
    assert record.attrs["llm.engine.placement"] in ("wall_clock", "end_anchored"), (
        engine, [(s.stage, s.duration_ns) for s in record.stages])
    return [s.stage for s in record.stages]


def _assert_contiguous(record) -> None:
    assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert all(s.duration_ns >= 0 for s in record.stages)
    assert all(a.end_ns == b.start_ns for a, b in zip(record.stages, record.stages[1:]))


@TRANSPORTS
def test_a_vllm_span_splits_the_upstream_window(proxy_factory, fake_upstream, transport):
    sink = OtlpSink().start()
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING, **GRPC,
                          environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url})
    sdk = _sdk(proxy, transport, gzip=transport == "grpc")
    try:
        response = stream_through(proxy.base_url, DELAY)
        assert response.status_code == 200
        seen, traceparent = _upstream_view(fake_upstream)
        trace_id, proxy_span_id = traceparent.split("-")[1:3]
        _parked(proxy)                      # finished, waiting for its span: not published
        assert proxy.parts.obs.store.get(trace_id) is None
        ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
        queue_s, prefill_s = ttft_s * 0.25, ttft_s * 0.5
        vllm_span(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                  end_ns=seen.first_content_epoch_ns + 1_000_000, ttft_s=ttft_s,
                  queue_s=queue_s, prefill_s=prefill_s, prompt_tokens=17)
        record = _record(proxy, trace_id)
        # The engine's parent is the join's secret, not the span id the client sees.
        assert record.span_id != proxy_span_id
        assert response.headers["server-timing"].startswith(f"trace;desc=00-{trace_id}-{record.span_id}-")
        assert _stages(record) == [
            "receive", "upstream_connect", "upstream_request", "queue", "prefill",
            "engine_other", "upstream_response", "send"]
        assert record.stage_ns("queue") == round(queue_s * 1e9)
        assert record.stage_ns("prefill") == round(prefill_s * 1e9)
        assert record.stage_ns("engine_other") == round(ttft_s * 1e9) - round(
            queue_s * 1e9) - round(prefill_s * 1e9)
        _assert_contiguous(record)
        assert record.attrs["llm.engine.source"] == "vllm"
        assert record.attrs["llm.engine.placement"] == "wall_clock"
        assert record.num_prompt_tokens == 17    # the stream had no usage: the span's count
        assert proxy.metric("llm_engine_timing_total", source="vllm", outcome="joined") == 1
        assert proxy.metric("llm_request_stage_duration_seconds_count", stage="queue") == 1

        # The tee: the destination got exactly the bytes the engine's exporter sent (over
        # gRPC: the message's bytes, gzip being the transport's, undone by grpcio).
        sent = encode_spans(sdk.memory.get_finished_spans()).SerializeToString()
        assert sink.wait_for(1)
        assert sink.bodies[0].body == sent
        assert sink.bodies[0].headers["content-type"] == "application/x-protobuf"
    finally:
        sdk.shutdown()
        sink.stop()


def test_gzip_bodies_are_forwarded_compressed_and_unchanged(proxy_factory, fake_upstream):
    sink = OtlpSink().start()
    proxy = proxy_factory(fake_upstream.base_url, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url.removesuffix("/v1/traces")})
    sdk = EngineSdk(proxy.base_url, gzip=True)
    try:
        stream_through(proxy.base_url, DELAY)
        seen, traceparent = _upstream_view(fake_upstream)
        vllm_span(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                  end_ns=seen.first_content_epoch_ns, ttft_s=0.01, queue_s=0.002,
                  prefill_s=0.005)
        assert sink.wait_for(1)
        body = sink.bodies[0]
        assert body.headers["content-encoding"] == "gzip"
        sent = encode_spans(sdk.memory.get_finished_spans()).SerializeToString()
        assert gzip.decompress(body.body) == sent
        # Bytes of our own: forwarded as they were, not re-compressed.
        own = gzip.compress(sent, compresslevel=1, mtime=0)
        import httpx
        answer = httpx.post(proxy.base_url + "/v1/traces", content=own, headers={
            "content-type": "application/x-protobuf", "content-encoding": "gzip"})
        assert answer.status_code == 200
        assert sink.wait_for(2) and sink.bodies[1].body == own
    finally:
        sdk.shutdown()
        sink.stop()


def test_a_span_that_never_comes_gives_timeout(proxy_factory, fake_upstream):
    """The record waits out `wait_s`, then is published as the proxy saw it."""
    proxy = proxy_factory(fake_upstream.base_url,
                          join=JoinSettings(wait_s=0.3, spans_expected=True))
    stream_through(proxy.base_url, DELAY)
    _, traceparent = _upstream_view(fake_upstream)
    record = _record(proxy, traceparent.split("-")[1])   # waits out the 0.3 s, bounded
    assert [s.stage for s in record.stages] == list(PROXY_STAGES)
    assert record.attrs["llm.engine.outcome"] == "timeout"
    assert proxy.metric("llm_engine_timing_total", source="none", outcome="timeout") == 1
    assert proxy.parts.join.num_expected == 0


def test_without_any_engine_span_records_do_not_wait(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)   # spans_expected off, none seen yet
    stream_through(proxy.base_url)
    proxy.wait_idle(timeout_s=5)
    assert proxy.parts.join.num_pending == 0
    assert proxy.metric("llm_engine_timing_total", source="none", outcome="no_signal") == 1


@TRANSPORTS
def test_trtllm_span_gives_queue_and_the_rest_as_engine_other(proxy_factory, fake_upstream,
                                                              transport):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING, **GRPC)
    sdk = _sdk(proxy, transport, service_name="trtllm-serve")
    try:
        stream_through(proxy.base_url, DELAY)
        seen, traceparent = _upstream_view(fake_upstream)
        _parked(proxy)
        ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
        trtllm_span(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                    end_ns=seen.first_content_epoch_ns, ttft_s=ttft_s, queue_s=ttft_s / 3)
        record = _record(proxy, traceparent.split("-")[1])
        assert _stages(record) == [
            "receive", "upstream_connect", "upstream_request", "queue", "engine_other",
            "upstream_response", "send"]
        assert record.stage_ns("queue") == round(ttft_s / 3 * 1e9)
        assert record.attrs["llm.engine.source"] == "trtllm"
        _assert_contiguous(record)
    finally:
        sdk.shutdown()


@TRANSPORTS
def test_sglang_stage_spans_split_its_queue_inclusive_prefill(proxy_factory, fake_upstream,
                                                              transport):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING, **GRPC)
    sdk = _sdk(proxy, transport, service_name="sglang", batch=True)
    try:
        stream_through(proxy.base_url, DELAY)
        seen, traceparent = _upstream_view(fake_upstream)
        _parked(proxy)
        ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
        tokenize_s, waiting_s, with_queue_s = ttft_s * 0.1, ttft_s * 0.3, ttft_s * 0.8
        sglang_spans(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                     end_ns=seen.first_content_epoch_ns, ttft_s=ttft_s, tokenize_s=tokenize_s,
                     waiting_s=waiting_s, prefill_with_queue_s=with_queue_s)
        sdk.flush()   # the request span and its stage spans in one export, as SGLang's batch
        record = _record(proxy, traceparent.split("-")[1])
        assert _stages(record) == [
            "receive", "upstream_connect", "upstream_request", "tokenize", "queue", "prefill",
            "engine_other", "upstream_response", "send"]
        assert record.stage_ns("tokenize") == round(tokenize_s * 1e9)
        assert record.stage_ns("queue") == round(waiting_s * 1e9)
        assert record.stage_ns("prefill") == round(with_queue_s * 1e9) - round(waiting_s * 1e9)
        assert record.attrs["llm.engine.source"] == "sglang"
        _assert_contiguous(record)
    finally:
        sdk.shutdown()


@TRANSPORTS
def test_tgi_router_spans_split_a_streamed_request(proxy_factory, fake_upstream, transport):
    """A stream has no `x-*-time` headers: its record waits for TGI's router spans."""
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING, **GRPC)
    sdk = _sdk(proxy, transport, service_name="text-generation-inference.router", batch=True)
    try:
        stream_through(proxy.base_url, DELAY)
        seen, traceparent = _upstream_view(fake_upstream)
        _parked(proxy)
        ttft_ns = seen.first_content_epoch_ns - seen.arrival_epoch_ns
        validation_ns, queue_ns = ttft_ns // 10, ttft_ns // 4
        tgi_spans(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                  end_ns=seen.first_content_epoch_ns + 50_000_000,
                  validation_ns=validation_ns, queue_ns=queue_ns,
                  first_token_ns=seen.first_content_epoch_ns)
        sdk.flush()   # the request span and its descendants in one export
        record = _record(proxy, traceparent.split("-")[1])
        assert _stages(record) == [
            "receive", "upstream_connect", "upstream_request", "tokenize", "queue", "prefill",
            "upstream_response", "send"]
        assert record.stage_ns("tokenize") == validation_ns
        assert record.stage_ns("queue") == queue_ns
        assert record.stage_ns("prefill") == ttft_ns - validation_ns - queue_ns
        assert record.attrs["llm.engine.source"] == "tgi"
        assert record.attrs["llm.engine.ttft_ns"] == ttft_ns
        assert proxy.metric("llm_engine_timing_total", source="tgi", outcome="joined") == 1
        _assert_contiguous(record)
    finally:
        sdk.shutdown()


def test_llamacpp_timings_join_at_once(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=EXPECTING)
    stream_through(proxy.base_url, {**DELAY, "x-fake-mode": "llamacpp",
                                    "x-fake-prompt-ms": "40.25", "x-fake-cache-n": "30"})
    _, traceparent = _upstream_view(fake_upstream)
    proxy.wait_idle(timeout_s=5)          # in-band: never parked
    record = _record(proxy, traceparent.split("-")[1])
    assert _stages(record) == [
        "receive", "upstream_connect", "upstream_other", "prefill", "send"]
    assert record.stage_ns("prefill") == 40_250_000
    assert record.attrs["llm.engine.placement"] == "end_anchored"
    assert (record.num_prompt_tokens, record.num_cached_tokens) == (35, 30)
    _assert_contiguous(record)
    assert proxy.metric("llm_engine_timing_total", source="llamacpp", outcome="joined") == 1
    assert proxy.metric("llm_ttft_by_cache_seconds_count", model="fake-model", cache="hit") == 1


def test_tgi_headers_on_a_whole_answer(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    response = stream_through(proxy.base_url, {**DELAY, "x-fake-mode": "tgi",
                                               "x-fake-tgi-ms": "50,3,7,40"}, body=body)
    assert response.status_code == 200 and response.headers["x-queue-time"] == "7"
    _, traceparent = _upstream_view(fake_upstream)
    record = _record(proxy, traceparent.split("-")[1])
    assert _stages(record) == [
        "receive", "upstream_connect", "upstream_other", "tokenize", "queue", "inference",
        "send"]
    assert [record.stage_ns(s) for s in ("tokenize", "queue", "inference")] == [
        3_000_000, 7_000_000, 40_000_000]
    assert record.attrs["llm.engine.source"] == "tgi"
    _assert_contiguous(record)
