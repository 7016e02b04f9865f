"""The proxy's OTLP/HTTP receiver under hostile and odd input (issue 24): each refusal is
the OTLP-specified one, counted, and costs no proxied request anything; spans that match no
record change none."""
from __future__ import annotations

import gzip
import json
import os
import socket

import httpx
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from engine_support import EngineSdk, stream_through
from proxy_support import wait_until
from tracer.proxy.engine_join import JoinSettings
from tracer.testing.engine_spans import vllm_span

PROTOBUF = {"content-type": "application/x-protobuf"}
DELAY = {"x-fake-first-token-delay-ms": "40"}


def _vllm_like(trace_id: bytes, span_id: bytes, parent: bytes, queue_s: float = 5.0) -> Span:
    def number(key, value):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name="llm_request",
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=1, end_time_unix_nano=2,
                attributes=[number("gen_ai.latency.time_to_first_token", queue_s * 2),
                            number("gen_ai.latency.time_in_queue", queue_s),
                            number("gen_ai.latency.time_in_model_prefill", queue_s / 2)])


def _export(spans: list[Span]) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


def _status(response: httpx.Response) -> Status:
    assert response.headers["content-type"] == "application/x-protobuf"
    return Status.FromString(response.content)


def test_garbage_protobuf_is_a_400_with_a_status(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    answer = httpx.post(proxy.base_url + "/v1/traces", content=b"\xff\xfe garbage \x00\x01",
                        headers=PROTOBUF)
    assert answer.status_code == 400
    assert _status(answer).code == 3   # INVALID_ARGUMENT
    bad_json = httpx.post(proxy.base_url + "/v1/traces", content=b'{"resourceSpans": 7}',
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and json.loads(bad_json.content)["code"] == 3
    bad_gzip = httpx.post(proxy.base_url + "/v1/traces", content=b"\x1f\x8b not gzip",
                          headers={**PROTOBUF, "content-encoding": "gzip"})
    assert bad_gzip.status_code == 400
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="http", outcome="malformed") == 3
    assert stream_through(proxy.base_url).status_code == 200   # the proxy still serves


def test_unsupported_media_and_methods(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    assert httpx.post(proxy.base_url + "/v1/traces", content=b"x",
                      headers={"content-type": "text/plain"}).status_code == 415
    assert httpx.post(proxy.base_url + "/v1/traces", content=b"x",
                      headers={**PROTOBUF, "content-encoding": "br"}).status_code == 415
    assert httpx.get(proxy.base_url + "/v1/traces").status_code == 405
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="http", outcome="unsupported") == 2


def test_a_100_mb_body_and_a_gzip_bomb_are_refused_unread(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    host, port = proxy.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/x-protobuf\r\ncontent-length: 104857600\r\n\r\n" + b"\0" * 4096)
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")
    bomb = gzip.compress(b"\0" * (100 << 20), compresslevel=9)   # ~100 kB → 100 MB
    answer = httpx.post(proxy.base_url + "/v1/traces", content=bomb,
                        headers={**PROTOBUF, "content-encoding": "gzip"})
    assert answer.status_code == 413 and _status(answer).code == 8   # RESOURCE_EXHAUSTED
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="http", outcome="too_large") == 2


def test_100k_spans_for_unknown_traces_change_nothing(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=JoinSettings(wait_s=30, spans_expected=True))
    with httpx.Client(timeout=30) as client:
        for batch in range(10):
            spans = [_vllm_like(os.urandom(16), os.urandom(8), os.urandom(8))
                     for _ in range(10_000)]
            answer = client.post(proxy.base_url + "/v1/traces", content=_export(spans),
                                 headers=PROTOBUF)
            assert answer.status_code == 200
            assert answer.content == ExportTraceServiceResponse().SerializeToString()
            if batch == 4:   # a request in the middle of the flood is served and recorded
                assert stream_through(proxy.base_url).status_code == 200
    # The spans are read after the export is answered (the engine's exporter never waits
    # for the join): wait for the last batch.
    assert wait_until(lambda: proxy.metric("llm_engine_timing_total", source="vllm",
                                           outcome="unmatched_span") >= 100_000)
    assert proxy.metric("llm_engine_timing_total", source="vllm",
                        outcome="unmatched_span") == 100_000
    assert proxy.metric("llm_otlp_receiver_spans_total") == 100_000
    # Nothing was kept for them: only the one proxied request ever entered the table.
    assert wait_until(lambda: proxy.parts.join.num_pending == 1)
    assert proxy.parts.join.num_expected == 1


def test_too_many_spans_in_one_export_is_refused(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    proxy.parts.otlp_receiver.max_spans = 100
    spans = [_vllm_like(os.urandom(16), os.urandom(8), b"") for _ in range(101)]
    answer = httpx.post(proxy.base_url + "/v1/traces", content=_export(spans), headers=PROTOBUF)
    assert answer.status_code == 400 and "101 spans" in _status(answer).message
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="http", outcome="too_many_spans") == 1


def test_a_span_of_another_parent_in_our_trace_changes_nothing(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=JoinSettings(wait_s=30, spans_expected=True))
    sdk = EngineSdk(proxy.base_url)
    try:
        stream_through(proxy.base_url, DELAY)
        seen = fake_upstream.state.requests[-1]
        traceparent = seen.headers["traceparent"]
        trace_id, span_id = traceparent.split("-")[1:3]
        assert wait_until(lambda: proxy.parts.join.num_pending == 1)
        forged = _vllm_like(bytes.fromhex(trace_id), os.urandom(8), os.urandom(8), queue_s=999.0)
        assert httpx.post(proxy.base_url + "/v1/traces", content=_export([forged]),
                          headers=PROTOBUF).status_code == 200
        assert wait_until(lambda: proxy.metric("llm_engine_timing_total", source="vllm",
                                               outcome="unmatched_span") == 1)
        assert proxy.parts.join.num_pending == 1     # still waiting for its own span
        ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
        vllm_span(sdk.tracer, traceparent, arrival_ns=seen.arrival_epoch_ns,
                  end_ns=seen.first_content_epoch_ns, ttft_s=ttft_s, queue_s=ttft_s / 4,
                  prefill_s=ttft_s / 2)
        proxy.wait_idle()
        record = proxy.parts.obs.store.get(trace_id)
        assert record.stage_ns("queue") == round(ttft_s / 4 * 1e9)
        # A second span for a record already joined: a conflict, counted; nothing changes.
        again = _vllm_like(bytes.fromhex(trace_id), os.urandom(8), bytes.fromhex(span_id), 7.0)
        httpx.post(proxy.base_url + "/v1/traces", content=_export([again]), headers=PROTOBUF)
        assert wait_until(lambda: proxy.metric("llm_engine_timing_total", source="vllm",
                                               outcome="conflict_span") == 1)
        assert proxy.parts.obs.store.get(trace_id).stage_ns("queue") == round(ttft_s / 4 * 1e9)
    finally:
        sdk.shutdown()


def test_otlp_json_with_hex_ids_joins(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, join=JoinSettings(wait_s=30, spans_expected=True))
    stream_through(proxy.base_url, DELAY)
    seen = fake_upstream.state.requests[-1]
    trace_id, span_id = seen.headers["traceparent"].split("-")[1:3]
    ttft_s = (seen.first_content_epoch_ns - seen.arrival_epoch_ns) / 1e9
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": trace_id, "spanId": "00f067aa0ba902b7", "parentSpanId": span_id,
        "name": "llm_request", "kind": 2, "startTimeUnixNano": str(seen.arrival_epoch_ns),
        "endTimeUnixNano": str(seen.first_content_epoch_ns),
        "attributes": [
            {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": ttft_s}},
            {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": ttft_s / 5}},
            {"key": "gen_ai.latency.time_in_model_prefill", "value": {"doubleValue": ttft_s / 2}},
            {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "9"}}]}]}]}]}
    answer = httpx.post(proxy.base_url + "/v1/traces", json=body)
    assert answer.status_code == 200 and answer.json() == {}
    proxy.wait_idle()
    record = proxy.parts.obs.store.get(trace_id)
    assert record.stage_ns("queue") == round(ttft_s / 5 * 1e9)
    assert record.num_prompt_tokens == 9


def test_bearer_token(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, otlp_receiver_token="s3cret")
    empty = _export([])
    assert httpx.post(proxy.base_url + "/v1/traces", content=empty,
                      headers=PROTOBUF).status_code == 401
    assert httpx.post(proxy.base_url + "/v1/traces", content=empty, headers={
        **PROTOBUF, "authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(proxy.base_url + "/v1/traces", content=empty, headers={
        **PROTOBUF, "authorization": "Bearer s3cret"}).status_code == 200
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="http", outcome="unauthorized") == 2


def test_the_receiver_can_be_turned_off(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, otlp_receiver=False)
    # Not ours then: relayed to the upstream like any other path (the fake accepts it).
    assert httpx.post(proxy.base_url + "/v1/traces", content=_export([]),
                      headers=PROTOBUF).status_code == 200
    assert fake_upstream.state.num_span_exports == 1
