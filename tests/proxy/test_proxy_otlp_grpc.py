"""The proxy's OTLP/gRPC receiver under hostile input: the gRPC status codes the OTLP
specification names, counted, and a slow client that holds nothing anyone else needs."""
from __future__ import annotations

import os
import socket

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from engine_support import stream_through
from proxy_support import wait_until

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _export_call(port: int):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
        ("grpc.max_send_message_length", 200 << 20)])
    # Raw bytes in, so a test can send what no exporter would.
    return channel, channel.unary_unary(METHOD, request_serializer=None,
                                        response_deserializer=ExportTraceServiceResponse.FromString)


def _spans(num: int) -> bytes:
    spans = [Span(trace_id=os.urandom(16), span_id=os.urandom(8), name="x") for _ in range(num)]
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


@pytest.fixture
def grpc_proxy(proxy_factory, fake_upstream):
    return proxy_factory(fake_upstream.base_url, otlp_grpc_listen="127.0.0.1:0",
                         otlp_receiver_token="tok")


AUTH = (("authorization", "Bearer tok"),)


def _code(call, body: bytes, metadata=AUTH) -> grpc.StatusCode:
    try:
        call(body, metadata=metadata, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def test_garbage_oversized_and_unauthenticated(grpc_proxy):
    channel, call = _export_call(grpc_proxy.parts.otlp_grpc.port)
    with channel:
        assert _code(call, b"\xff\xff\xff garbage") == grpc.StatusCode.INVALID_ARGUMENT
        assert _code(call, b"\0" * (100 << 20)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _code(call, _spans(1), metadata=()) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(call, _spans(3)) == grpc.StatusCode.OK
    assert grpc_proxy.metric("llm_otlp_receiver_requests_total", transport="grpc",
                             outcome="malformed") == 1
    assert grpc_proxy.metric("llm_otlp_receiver_requests_total", transport="grpc",
                             outcome="unauthorized") == 1
    assert wait_until(lambda: grpc_proxy.metric("llm_otlp_receiver_requests_total",
                                                transport="grpc", outcome="accepted") == 1)
    assert grpc_proxy.metric("llm_otlp_receiver_spans_total") == 3


def test_a_slow_client_costs_others_nothing(grpc_proxy):
    port = grpc_proxy.parts.otlp_grpc.port
    slow = []
    try:
        for _ in range(32):   # connections that send half an HTTP/2 preface and stall
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"PRI * HTTP/2.0\r\n")
            slow.append(sock)
        channel, call = _export_call(port)
        with channel:
            assert _code(call, _spans(2)) == grpc.StatusCode.OK
        assert stream_through(grpc_proxy.base_url).status_code == 200
    finally:
        for sock in slow:
            sock.close()
