"""Span export: our OTLP encoding parses, with the official protobuf classes, to exactly what
the SDK's encoder produces; the fast path is the one installed; spans reach a real OTLP/HTTP
endpoint on loopback; a processor without the fast path still exports."""
from __future__ import annotations

import http.server
import threading

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState
from prometheus_client import CollectorRegistry

from tracer.core.request_tracer import Tracer
from tracer.sinks.metrics import LLMMetrics
from tracer.record.clock import Clock
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.tracer_provider import make_tracer_provider
from tracer.sinks.export_drops import ExportDrops
from tracer.sinks.otlp_encoding import EncodedSpan, TraceRequestEncoder
from tracer.sinks.otlp_export import EncodingBatchSpanProcessor, FastOTLPSpanExporter
from tracer.record.stages import PROXY_STAGES, SERVER_STAGES
from tracer.record.traceparent import parse_traceparent
from tracer.web.observability import ObservabilitySettings, build_observability

REMOTE_PARENT = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def our_request_spans(stages=SERVER_STAGES, source="engine", n=3):
    """The spans the tracer emits for `n` finished requests (server span + stage spans)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ttftscope-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(provider, Clock())
    tracer = Tracer(model_names=("m",), stages=stages, source=source, span_builder=builder,
                    sinks=[LLMMetrics(CollectorRegistry(), model_names=("m",), stages=stages),
                           builder])
    for i in range(n):
        active = tracer.begin(request_id=f"r{i}", model="m", operation="chat",
                              traceparent=REMOTE_PARENT if i % 2 else None, start_ns=1_000,
                              attrs={"stream": True, "gen_ai.request.temperature": 0.25})
        active.timeline.event("prefill_chunk", 1_500, num_tokens=16, batch_size=2)
        for j, stage in enumerate(stages):
            active.timeline.mark(stage, 2_000 + j * 1_000)
        active.timeline.stage_attr(stages[0], "note", "ünïcode ✓")
        if i == 1:   # a stage attribute named like the stage's own: the general path
            active.timeline.stage_attr(stages[1], "stage", "shadowed")
        for k in range(4):
            active.timeline.emit(20_000 + k * 1_000)
        tracer.finish(active, end_ns=40_000, finish_reason="stop" if i else "error",
                      error_type=None if i else "upstream")
    return exporter.get_finished_spans()


def odd_spans():
    """SDK spans with every value kind, events, links, a described error, a trace state."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "odd", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel = provider.get_tracer("odd.scope", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0")
    link = Link(SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                            trace_state=TraceState([("k", "v")])), {"why": "retry"})
    with otel.start_as_current_span("outer", kind=SpanKind.CLIENT, links=[link], attributes={
            "i": -5, "big": 2**62, "f": -0.5, "b": False, "s": "x" * 300, "ints": [1, -2, 3],
            "strs": ("a", "é"), "bools": [True, False], "floats": [1.5, 2.5]}) as outer:
        outer.add_event("ev", {"k": "v", "n": 1})
        outer.add_event("empty")
        with otel.start_as_current_span("inner", kind=SpanKind.CONSUMER) as inner:
            inner.set_status(Status(StatusCode.ERROR, "it broke"))
    return exporter.get_finished_spans()


@pytest.mark.parametrize("spans", [
    pytest.param(our_request_spans(), id="engine-request-spans"),
    pytest.param(our_request_spans(PROXY_STAGES, "proxy"), id="proxy-request-spans"),
    pytest.param(odd_spans(), id="every-value-kind"),
    pytest.param(our_request_spans() + odd_spans(), id="two-resources-and-scopes"),
])
def test_encoding_equals_the_sdk_encoder(spans):
    ours = ExportTraceServiceRequest.FromString(TraceRequestEncoder().encode(spans))
    assert ours == encode_spans(spans)
    # Spans encoded one by one as they end give the same request.
    pre_encoded = [EncodedSpan.of(span) for span in spans]
    assert ExportTraceServiceRequest.FromString(TraceRequestEncoder().encode(pre_encoded)) == ours


def test_the_installed_exporter_takes_the_fast_path():
    provider = make_tracer_provider(environ={
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"})
    (processor,) = provider._active_span_processor._span_processors
    assert isinstance(processor, EncodingBatchSpanProcessor)
    # False here means an SDK upgrade moved the internals: export still works, slower.
    assert processor.fast_path and processor.span_exporter.fast_path
    provider.shutdown()


class _Sink(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).bodies.append((self.path, self.headers["content-type"], body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def otlp_sink():
    _Sink.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", _Sink.bodies
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("exporter_class", [FastOTLPSpanExporter, OTLPSpanExporter],
                         ids=["fast-path", "sdk-exporter-fallback"])
def test_spans_reach_an_otlp_http_endpoint(otlp_sink, exporter_class):
    url, bodies = otlp_sink
    processor = EncodingBatchSpanProcessor(exporter_class(endpoint=url))
    assert processor.fast_path is (exporter_class is FastOTLPSpanExporter)
    spans = our_request_spans(n=2)
    for span in spans:
        processor.on_end(span)
    assert processor.force_flush(10_000)
    received = [ExportTraceServiceRequest.FromString(body) for _, _, body in bodies]
    assert {(path, ctype) for path, ctype, _ in bodies} == {("/v1/traces", "application/x-protobuf")}
    got = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted((s.name, s.span_id) for s in got) == sorted(
        (s.name, s.context.span_id.to_bytes(8, "big")) for s in spans)
    processor.shutdown()


def test_unsampled_spans_are_not_exported(otlp_sink):
    url, bodies = otlp_sink
    processor = EncodingBatchSpanProcessor(FastOTLPSpanExporter(endpoint=url))
    (span, *_) = our_request_spans(n=1)
    unsampled = SpanContext(span.context.trace_id, span.context.span_id, is_remote=False,
                            trace_flags=TraceFlags(0))
    processor.on_end(type(span)(name="x", context=unsampled, resource=span.resource))
    assert processor.force_flush(10_000)
    assert bodies == []
    processor.shutdown()


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A collector that refuses every export (400: not retryable, so it fails at once)."""

    posts = 0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers["content-length"]))
        type(self).posts += 1
        self.send_response(400)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_sink():
    _Refusing.posts = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()
    server.server_close()


def test_spans_a_collector_refuses_are_counted_export_failed(refusing_sink):
    drops = ExportDrops()
    processor = EncodingBatchSpanProcessor(
        FastOTLPSpanExporter(endpoint=refusing_sink, drops=drops), drops=drops,
        schedule_delay_millis=60_000)
    spans = our_request_spans(n=2)
    for span in spans:
        processor.on_end(span)
    processor.force_flush(10_000)
    assert _Refusing.posts == 1
    assert drops.snapshot()[1]["export_failed"] == len(spans)
    processor.shutdown()


def test_the_export_drop_counter_is_in_the_process_registry(refusing_sink):
    """Through `build_observability`: the registry a front serves on /metrics."""
    obs = build_observability(ObservabilitySettings(), model_names=("m",),
                              tracer_provider=make_tracer_provider(environ={
                                  "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": refusing_sink,
                                  "OTEL_BSP_SCHEDULE_DELAY": "60000"}))

    def failed() -> float:
        return obs.registry.get_sample_value("otel_spans_dropped_total",
                                             {"reason": "export_failed"})
    before = failed()
    active = obs.tracer.begin(request_id="r", model="m", operation="chat", traceparent=None,
                              start_ns=1_000)
    for i, stage in enumerate(SERVER_STAGES):
        active.timeline.mark(stage, 2_000 + i)
    obs.tracer.finish(active, end_ns=9_000, finish_reason="stop")
    assert obs.close()   # the server's shutdown: the tracer's worker drains, the export flushes
    assert failed() - before == 1 + len(SERVER_STAGES)
    assert {obs.registry.get_sample_value("otel_spans_dropped_total", {"reason": r}) is not None
            for r in ExportDrops.REASONS} == {True}
    obs.tracer_provider.shutdown()


def test_a_full_queue_and_a_shut_down_processor_count_their_drops(otlp_sink):
    url, _ = otlp_sink
    drops = ExportDrops()
    processor = EncodingBatchSpanProcessor(FastOTLPSpanExporter(endpoint=url), drops=drops,
                                           max_queue_size=3, max_export_batch_size=3,
                                           schedule_delay_millis=60_000)
    spans = our_request_spans(n=1)            # ten spans: the queue holds three
    processor._batch_processor._worker_awaken.set = lambda: None   # keep the worker asleep
    for span in spans:
        processor.on_end(span)
    assert drops.snapshot()[1]["queue_full"] == len(spans) - 3
    del processor._batch_processor._worker_awaken.set   # shutdown wakes the worker again
    processor.shutdown()
    processor.on_end(spans[0])
    assert drops.snapshot()[1]["shutdown"] == 1


@pytest.mark.parametrize("max_queue_size,already_queued", [(64, 0), (12, 5), (3, 0), (3, 3)])
def test_a_requests_spans_handed_over_together_queue_and_drop_as_one_at_a_time(
        otlp_sink, max_queue_size, already_queued):
    """`on_end_encoded_many` against the SDK's `emit` once a span: the same queue, in the
    same order, and the same drops counted, when the queue has room, fills, or is full; and
    after shutdown."""
    url, _ = otlp_sink
    spans = [EncodedSpan.of(s) for s in our_request_spans(n=1)]
    ends = []
    for many in (False, True):
        drops = ExportDrops()
        processor = EncodingBatchSpanProcessor(
            FastOTLPSpanExporter(endpoint=url), drops=drops, max_queue_size=max_queue_size,
            max_export_batch_size=max_queue_size, schedule_delay_millis=60_000)
        batch = processor._batch_processor
        assert processor._emits_many
        batch._worker_awaken.set = lambda: None     # keep the worker asleep
        for span in spans[:already_queued]:
            processor.on_end_encoded(span)
        if many:
            processor.on_end_encoded_many(spans)
        else:
            for span in spans:
                processor.on_end_encoded(span)
        queued = [id(s) for s in batch._queue]
        full = drops.snapshot()[1]["queue_full"]
        batch._queue.clear()
        del batch._worker_awaken.set
        processor.shutdown()
        (processor.on_end_encoded_many if many else
         lambda ss: [processor.on_end_encoded(s) for s in ss])(spans[:4])
        ends.append((queued, full, drops.snapshot()[1]["shutdown"]))
    assert ends[0] == ends[1]
    assert ends[1][2] == 4 and ends[1][1] == max(0, already_queued + len(spans) - max_queue_size)


def test_a_batch_over_the_size_limit_is_split_and_only_a_span_too_large_alone_is_lost(otlp_sink):
    url, bodies = otlp_sink
    spans = our_request_spans(n=2)
    one_span_bytes = max(len(TraceRequestEncoder().encode([s])) for s in spans)
    huge = spans[0].__class__(name="huge", context=spans[0].context, resource=spans[0].resource,
                              attributes={"blob": "x" * (4 * one_span_bytes)},
                              instrumentation_scope=spans[0].instrumentation_scope,
                              start_time=1, end_time=2)
    drops = ExportDrops()
    exporter = FastOTLPSpanExporter(endpoint=url, max_request_size=2 * one_span_bytes,
                                    drops=drops)
    batch = [EncodedSpan.of(s) for s in [*spans[:4], huge, *spans[4:]]]
    exporter.export(batch)
    got = [s.name for _, _, body in bodies
           for rs in ExportTraceServiceRequest.FromString(body).resource_spans
           for ss in rs.scope_spans for s in ss.spans]
    assert sorted(got) == sorted(s.name for s in spans)
    assert all(len(body) <= 2 * one_span_bytes for _, _, body in bodies)
    assert drops.snapshot()[1]["too_large"] == 1
    exporter.shutdown()


class _CountingIds:
    """Ids 1, 2, 3, ...: two providers then make the same spans with the same ids."""

    def __init__(self):
        self.n = 0

    def generate_span_id(self):
        self.n += 1
        return self.n

    def generate_trace_id(self):
        self.n += 1
        return (0xABC << 64) + self.n


class _TakesEncoded:
    """A processor on the encoded path, as `EncodingBatchSpanProcessor` with its fast path."""

    fast_path = True

    def __init__(self):
        self.encoded = []

    def on_end_encoded(self, encoded):
        self.encoded.append(encoded)

    def on_end(self, span):   # never called on the encoded path
        raise AssertionError("on_end called on the encoded path")

    def on_start(self, span, parent_context=None):
        pass

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def _request_spans_through(processor, stages, source):
    from opentelemetry.sdk.trace import TracerProvider as Provider

    provider = Provider(resource=Resource.create({"service.name": "ttftscope-test"}),
                        id_generator=_CountingIds())
    provider.add_span_processor(processor)
    builder = SpanBuilder(provider, Clock(wall_ns=1_700_000_000 * 10**9, perf_ns=0))
    tracer = Tracer(model_names=("m",), stages=stages, source=source, span_builder=builder,
                    sinks=[builder])
    for i in range(3):
        active = tracer.begin(request_id=f"r{i}", model="m", operation="chat",
                              traceparent=REMOTE_PARENT if i % 2 else None, start_ns=1_000,
                              attrs={"stream": True, "gen_ai.request.temperature": 0.25})
        active.timeline.event("prefill_chunk", 1_500, num_tokens=16, batch_size=2)
        active.timeline.event("preempted", 1_600)
        for j, stage in enumerate(stages[:-2] if i == 2 else stages):   # 2: no first token
            active.timeline.mark(stage, 2_000 + j * 1_000)
        active.timeline.stage_attr(stages[0], "note", "ünïcode ✓")
        if i == 1:   # a stage attribute named like the stage's own: the general path
            active.timeline.stage_attr(stages[1], "stage", "shadowed")
        for k in range(4 if i != 2 else 0):
            active.timeline.emit(20_000 + k * 1_000)
        if source == "proxy":
            active.attrs["llm.upstream.span_id"] = f"{0xFEED + i:016x}"
        tracer.finish(active, end_ns=40_000, finish_reason="stop" if i else "error",
                      error_type=None if i else "upstream")
    return builder


@pytest.mark.parametrize("stages,source", [(SERVER_STAGES, "engine"), (PROXY_STAGES, "proxy")])
def test_spans_encoded_from_the_record_are_the_bytes_of_their_readable_spans(stages, source):
    """The builder's encoded path (no `ReadableSpan`: the production processor) writes, span
    for span, the bytes the `ReadableSpan` path's spans encode to."""
    from tracer.sinks.otlp_encoding import encode_span

    direct = _TakesEncoded()
    builder = _request_spans_through(direct, stages, source)
    assert builder._direct_processors() is not None     # one span at a time: no `_many`
    exporter = InMemorySpanExporter()
    _request_spans_through(SimpleSpanProcessor(exporter), stages, source)
    readable = exporter.get_finished_spans()
    assert len(readable) == len(direct.encoded) > 3 * len(stages) - 2
    assert [e.data for e in direct.encoded] == [encode_span(s) for s in readable]
    assert {(e.resource, e.instrumentation_scope) for e in direct.encoded} == {
        (readable[0].resource, readable[0].instrumentation_scope)}


def test_the_installed_processor_takes_spans_encoded_from_the_record():
    provider = make_tracer_provider(environ={
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"})
    builder = SpanBuilder(provider, Clock())
    (processor,) = provider._active_span_processor._span_processors
    assert builder._direct_processors() == (processor.on_end_encoded_many,)
    # Another processor beside it (a test's in-memory exporter): ReadableSpans for all.
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert builder._direct_processors() is None
    provider.shutdown()
