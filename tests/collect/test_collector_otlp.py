"""The collector's OTLP/HTTP receiver is a tee: spans an engine exports to it go on,
unchanged, to the collector's own OTLP destination; bad input gets the OTLP refusals."""
from __future__ import annotations

import gzip

from fastapi.testclient import TestClient
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client import CollectorRegistry

from tracer.collect.app import CollectorSettings, create_collector_app
from tracer.testing.otlp_sink import OtlpSink
from tracer.web.observability import ObservabilitySettings

PROTOBUF = {"content-type": "application/x-protobuf"}


def _export() -> bytes:
    span = Span(trace_id=bytes(range(16)), span_id=bytes(range(8)), name="llm_request")
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()


def test_the_collector_forwards_spans_byte_for_byte():
    sink = OtlpSink().start()
    registry = CollectorRegistry()
    parts = create_collector_app(CollectorSettings(ObservabilitySettings(beacon_key="k")),
                                 registry=registry,
                                 environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url})
    try:
        with TestClient(parts.app) as client:
            body = gzip.compress(_export(), mtime=0)
            answer = client.post("/v1/traces", content=body,
                                 headers={**PROTOBUF, "content-encoding": "gzip"})
            assert answer.status_code == 200
            garbage = client.post("/v1/traces", content=b"\xff\xff", headers=PROTOBUF)
            assert garbage.status_code == 400 and Status.FromString(garbage.content).code == 3
            assert sink.wait_for(1)
            assert sink.bodies[0].body == body
            assert sink.bodies[0].headers["content-encoding"] == "gzip"
        assert registry.get_sample_value("llm_otlp_receiver_requests_total",
                                         {"transport": "http", "outcome": "malformed"}) == 1
        assert registry.get_sample_value("llm_otlp_forward_total", {"outcome": "sent"}) == 1
    finally:
        sink.stop()
