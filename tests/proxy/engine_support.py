"""Helpers for the engine-join tests: a streamed request through the proxy, the engine SDK
that exports spans to the proxy's receiver with the real `OTLPSpanExporter`."""
from __future__ import annotations

import httpx
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.testing.fake_upstream import MODEL

CHAT = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def stream_through(proxy_url: str, headers: dict | None = None, body: dict = CHAT) -> httpx.Response:
    """One completion through the proxy, read to the end."""
    with httpx.Client(timeout=30, trust_env=False) as client:
        response = client.post(proxy_url + "/v1/chat/completions", json=body,
                               headers=headers or {})
        response.read()
    return response


class EngineSdk:
    """An engine process's OpenTelemetry SDK: a provider whose spans go, as each ends, to
    the proxy's `/v1/traces` through the SDK's own OTLP/HTTP exporter (and to memory, so a
    test can encode them itself)."""

    def __init__(self, proxy_url: str, *, token: str | None = None, gzip: bool = False,
                 service_name: str = "vllm", batch: bool = False,
                 grpc_port: int | None = None) -> None:
        """`grpc_port`: export over OTLP/gRPC there (the engines' default) instead of HTTP."""
        headers = {"authorization": f"Bearer {token}"} if token else None
        if grpc_port is None:
            self.exporter = OTLPSpanExporter(
                endpoint=proxy_url + "/v1/traces", headers=headers,
                compression=Compression.Gzip if gzip else Compression.NoCompression)
        else:
            import grpc
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
            self.exporter = GrpcSpanExporter(
                endpoint=f"127.0.0.1:{grpc_port}", insecure=True,
                headers=tuple((headers or {}).items()) or None,
                compression=grpc.Compression.Gzip if gzip else grpc.Compression.NoCompression)
        self.memory = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        # batch: as the engines export (BatchSpanProcessor), one export per `flush()`.
        self.provider.add_span_processor(
            BatchSpanProcessor(self.exporter, schedule_delay_millis=600_000) if batch
            else SimpleSpanProcessor(self.exporter))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("vllm.llm_engine")

    def flush(self) -> None:
        assert self.provider.force_flush(10_000)

    def shutdown(self) -> None:
        self.provider.shutdown()
