"""The collector's receivers (issue 32, item 1): the real OpenTelemetry SDK exporting over
OTLP/gRPC builds the whole path as OTLP/HTTP does; the receiver's limits and token hold at
the collector as they do at the proxy; hostile exports cost bounded memory and no record."""
from __future__ import annotations

import gzip
import json

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from test_whole_path_join import App
from tests.integration.prom_support import free_port
from whole_path_support import BROWSER_SPAN, VLLM, backend_trace, beacon, export, now_base_ns

JSON = {"content-type": "application/json"}


def _provider(service: str, endpoint: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint,
                                                                     insecure=True)))
    return provider


def test_the_real_sdk_over_grpc_gives_the_whole_path():
    port = free_port()
    app = App(otlp_grpc_listen=f"127.0.0.1:{port}")
    trace_id = 0x5bf92f3577b34da6a3ce929d0e0e4736
    browser = trace.set_span_in_context(NonRecordingSpan(SpanContext(
        trace_id, int(BROWSER_SPAN, 16), is_remote=True, trace_flags=TraceFlags(1))))
    with app.client:
        backend = _provider("chat-backend", f"127.0.0.1:{port}").get_tracer("t")
        engine = _provider("vllm", f"127.0.0.1:{port}").get_tracer("t")
        t0 = now_base_ns()
        ms = 1_000_000
        root = backend.start_span("POST /chat", context=browser, kind=SpanKind.SERVER,
                                  start_time=t0)
        in_root = trace.set_span_in_context(root)
        backend.start_span("auth", context=in_root, start_time=t0 + ms).end(t0 + 5 * ms)
        call = backend.start_span("POST", context=in_root, kind=SpanKind.CLIENT,
                                  start_time=t0 + 6 * ms)
        engine.start_span("llm_request", context=trace.set_span_in_context(call),
                          kind=SpanKind.SERVER, start_time=t0 + 7 * ms,
                          attributes=VLLM).end(t0 + 200 * ms)
        call.end(t0 + 200 * ms)
        root.end(t0 + 300 * ms)
        trace_hex = f"{trace_id:032x}"
        assert app.beacon(beacon(trace_hex, headers=10.0, end=305.0, first_token=80.0)) == 202
        view = app.trace(trace_hex)
        assert view is not None
    segments = [(s["attrs"]["part"], s["stage"]) for s in view["stages"]]
    assert ("backend", "auth") in segments and ("engine", "prefill") in segments
    assert sum(s["duration_ms"] for s in view["stages"]) == pytest.approx(80.0)
    assert app.value("llm_otlp_receiver_requests_total", transport="grpc",
                     outcome="accepted") == 4     # one export per span (SimpleSpanProcessor)


def test_the_receivers_limits_and_token_hold_at_the_collector():
    app = App(otlp_receiver_token="s3cret")
    auth = {**JSON, "authorization": "Bearer s3cret"}
    base = now_base_ns()
    body = export(backend_trace("4bf92f3577b34da6a3ce929d0e0e4736", base))
    with app.client as c:
        assert c.post("/v1/traces", content=body, headers=JSON).status_code == 401
        assert c.post("/v1/traces", content=b"x" * (5 << 20), headers=auth).status_code == 413
        bomb = gzip.compress(b"{" + b" " * (32 << 20) + b"}")
        assert c.post("/v1/traces", content=bomb,
                      headers={**auth, "content-encoding": "gzip"}).status_code == 413
        assert c.post("/v1/traces", content=b"{not json", headers=auth).status_code == 400
        deep = b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        assert c.post("/v1/traces", content=deep, headers=auth).status_code == 400
        assert c.post("/v1/traces", content=body, headers=auth).status_code == 200
    assert app.value("llm_otlp_receiver_requests_total", transport="http",
                     outcome="unauthorized") == 1
    assert app.value("llm_collector_spans_total", outcome="accepted") == 8


def test_a_trace_flooded_with_spans_keeps_its_bound_and_its_path():
    app = App(max_spans_per_trace=64)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    base = now_base_ns()
    spans = backend_trace(trace_id, base)
    flood = [dict(spans[1], span_id=f"{i:016x}", name=f"junk {i}") for i in range(1, 2000)]
    with app.client:
        app.spans(spans)      # the real ones first: the bound keeps what came first
        app.spans(flood)
        assert app.beacon(beacon(trace_id)) == 202
        view = app.trace(trace_id)
    assert app.value("llm_collector_spans_total", outcome="over_limit") == 2000 - 1 - (64 - 8)
    assert sum(s["duration_ms"] for s in view["stages"]) == pytest.approx(320.0)
    # junk spans that got in are on the path only where they are the last to finish; their
    # names are never labels (one-off names)
    assert app.value("llm_path_segment_seconds_count", model="m", part="backend",
                     segment="other") == 1
    json.dumps(view)
