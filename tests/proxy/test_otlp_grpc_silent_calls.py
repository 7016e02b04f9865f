"""Issue 39, break 6: gRPC Export calls that never send their message hold nothing a real
export needs. The token is checked from the metadata before any message is read, a call
has `read_timeout_s` to send its message, and 50 silent calls (loopback, bounded) leave
room for a real export within its deadline."""
from __future__ import annotations

import os
import threading
import time

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from proxy_support import wait_until

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
AUTH = (("authorization", "Bearer tok"),)
NUM_SILENT = 50


def _export() -> bytes:
    span = Span(trace_id=os.urandom(16), span_id=os.urandom(8), name="x")
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()


def _silent(release: threading.Event):
    """A request stream that sends nothing until `release` (then ends, empty)."""
    release.wait(60)
    return
    yield  # noqa: unreachable - makes this a generator


def _stubs(channel):
    unary = channel.unary_unary(METHOD, request_serializer=None,
                                response_deserializer=ExportTraceServiceResponse.FromString)
    # The same method as a client stream: the wire is the same, and the stream may be
    # left without a message, as a hostile client leaves it.
    streaming = channel.stream_unary(METHOD, request_serializer=None,
                                     response_deserializer=ExportTraceServiceResponse.FromString)
    return unary, streaming


@pytest.fixture
def grpc_proxy(proxy_factory, fake_upstream):
    return proxy_factory(fake_upstream.base_url, otlp_grpc_listen="127.0.0.1:0",
                         otlp_receiver_token="tok", otlp_grpc_read_timeout_s=30.0)


def test_a_real_export_is_served_while_fifty_calls_are_silent(grpc_proxy):
    port = grpc_proxy.parts.otlp_grpc.port
    release = threading.Event()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    unary, streaming = _stubs(channel)
    silent = []
    try:
        for _ in range(NUM_SILENT):   # authenticated: the token alone does not help here
            silent.append(streaming.future(_silent(release), metadata=AUTH, timeout=60))
        time.sleep(1.0)   # let the server take every call in (their headers are sent)
        assert not any(call.done() for call in silent)
        started = time.monotonic()
        assert unary(_export(), metadata=AUTH, timeout=5) == ExportTraceServiceResponse()
        assert time.monotonic() - started < 5
    finally:
        release.set()
        for call in silent:
            call.cancel()
        channel.close()
    assert wait_until(lambda: grpc_proxy.metric(
        "llm_otlp_receiver_requests_total", transport="grpc", outcome="accepted") == 1)


def test_a_call_without_the_token_is_refused_before_its_message(grpc_proxy):
    release = threading.Event()
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_proxy.parts.otlp_grpc.port}")
    _, streaming = _stubs(channel)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            # No message is ever sent: only a check of the metadata can answer this.
            streaming(_silent(release), metadata=(("authorization", "Bearer wrong"),),
                      timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert time.monotonic() - started < 5
    finally:
        release.set()
        channel.close()
    assert grpc_proxy.metric("llm_otlp_receiver_requests_total", transport="grpc",
                             outcome="unauthorized") == 1


def test_a_call_has_a_deadline_to_send_its_message(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url, otlp_grpc_listen="127.0.0.1:0",
                          otlp_receiver_token="tok", otlp_grpc_read_timeout_s=0.5)
    release = threading.Event()
    channel = grpc.insecure_channel(f"127.0.0.1:{proxy.parts.otlp_grpc.port}")
    unary, streaming = _stubs(channel)
    try:
        with pytest.raises(grpc.RpcError) as cut:
            streaming(_silent(release), metadata=AUTH, timeout=20)   # the client would wait
        assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no request message" in cut.value.details()
        # A stream that ends without its message: what grpcio says for a unary method.
        release.set()
        with pytest.raises(grpc.RpcError) as empty:
            streaming(iter(()), metadata=AUTH, timeout=10)
        assert empty.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert unary(_export(), metadata=AUTH, timeout=5) == ExportTraceServiceResponse()
    finally:
        release.set()
        channel.close()
    assert proxy.metric("llm_otlp_receiver_requests_total", transport="grpc",
                        outcome="read_timeout") == 1
