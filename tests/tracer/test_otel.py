"""Spans: names, parentage, exact times, GenAI attributes, error status, sampling, cost."""
from __future__ import annotations

import re
import time

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tracer.record.emits import GapSummary
from tracer.record.clock import Clock
from tracer.sinks.server_span import continued_parent, current_parent
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.tracer_provider import make_tracer_provider
from tracer.record.traceparent import TraceParent, parse_traceparent
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import SERVER_STAGES

INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
WALL_NS = 1_700_000_000_000_000_000
PERF_NS = 50_000_000


@pytest.fixture()
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(provider, Clock(wall_ns=WALL_NS, perf_ns=PERF_NS))
    yield builder, exporter
    provider.shutdown()


def make_record(server_span, *, t0_ns=PERF_NS + 1_000, finish_reason="stop", error_type=None,
                events=None) -> RequestRecord:
    # Stage i lasts (i + 1) µs so every stage has a distinct, checkable duration.
    stages, t = [], t0_ns
    attrs = {"kv_lookup": {"num_hit_tokens": 32, "num_hit_blocks": 2},
             "detokenize": {"num_tokens": 2}, "prefill": {"flops_per_s": 1.5e12}}
    for i, stage in enumerate(SERVER_STAGES):
        stages.append(StageSpan(stage, t, t + (i + 1) * 1_000, attrs.get(stage, {})))
        t += (i + 1) * 1_000
    prefill = stages[SERVER_STAGES.index("prefill")]
    if events is None:
        events = (("prefill_chunk", prefill.start_ns, {"num_tokens": 16, "batch_size": 3}),
                  ("prefill_chunk", prefill.start_ns + 500, {"num_tokens": 8, "batch_size": 1}),
                  ("preempted", t0_ns + 100, {}))
    return RequestRecord(
        request_id="req-1", trace_id=server_span.trace_id, span_id=server_span.span_id,
        model="smollm2", operation="chat", start_ns=t0_ns, end_ns=t + 7_000, stages=tuple(stages),
        ttft_ns=t - t0_ns, itl=GapSummary.of((1_000, 2_000)), num_prompt_tokens=56, num_cached_tokens=32,
        num_output_tokens=3, finish_reason=finish_reason, error_type=error_type, events=events,
        attrs={"gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 0.7},
    )


def start(builder, traceparent=INCOMING, t0_ns=PERF_NS + 1_000, attributes=None):
    return builder.start_server_span(operation="chat", model="smollm2",
                                     parent=parse_traceparent(traceparent), start_perf_ns=t0_ns,
                                     attributes=attributes or {})


def by_name(exporter) -> dict:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_clock_maps_perf_to_epoch_with_one_anchor():
    clock = Clock(wall_ns=WALL_NS, perf_ns=PERF_NS)
    assert clock.to_epoch_ns(PERF_NS) == WALL_NS
    assert clock.to_epoch_ns(PERF_NS + 123) == WALL_NS + 123
    assert clock.to_epoch_ns(PERF_NS - 7) == WALL_NS - 7
    default = Clock()
    assert abs(default.to_epoch_ns(time.perf_counter_ns()) - time.time_ns()) < 50_000_000


def test_server_span_continues_incoming_trace_and_children_nest(exported):
    builder, exporter = exported
    server = start(builder)
    assert server.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert re.fullmatch(r"[0-9a-f]{16}", server.span_id) and server.span_id != "b7ad6b7169203331"
    assert str(server.traceparent) == f"00-{server.trace_id}-{server.span_id}-01"
    builder.finish(server, make_record(server))
    spans = by_name(exporter)
    assert set(spans) == {"chat smollm2"} | {f"llm.{s}" for s in SERVER_STAGES}
    root = spans["chat smollm2"]
    assert root.context.trace_id == int(server.trace_id, 16)
    assert root.context.span_id == int(server.span_id, 16)
    assert root.parent.span_id == int("b7ad6b7169203331", 16)
    assert root.kind is SpanKind.INTERNAL
    child_ids = set()
    for stage in SERVER_STAGES:
        child = spans[f"llm.{stage}"]
        assert child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        child_ids.add(child.context.span_id)
    assert len(child_ids) == len(SERVER_STAGES) and root.context.span_id not in child_ids


def test_stage_spans_have_exact_epoch_times(exported):
    builder, exporter = exported
    server = start(builder)
    record = make_record(server)
    builder.finish(server, record)
    spans = by_name(exporter)
    offset = WALL_NS - PERF_NS
    for stage in record.stages:
        span = spans[f"llm.{stage.stage}"]
        assert (span.start_time, span.end_time) == (stage.start_ns + offset, stage.end_ns + offset)
    root = spans["chat smollm2"]
    assert (root.start_time, root.end_time) == (record.start_ns + offset, record.end_ns + offset)
    # Contiguous stages stay contiguous after the mapping.
    ordered = [spans[f"llm.{s}"] for s in SERVER_STAGES]
    assert all(a.end_time == b.start_time for a, b in zip(ordered, ordered[1:]))


def test_genai_and_stage_attributes(exported):
    builder, exporter = exported
    server = start(builder)
    record = make_record(server)
    builder.finish(server, record)
    spans = by_name(exporter)
    root = spans["chat smollm2"].attributes
    assert root["gen_ai.operation.name"] == "chat"
    assert root["gen_ai.provider.name"] == "ttftscope"
    assert root["gen_ai.request.model"] == "smollm2"
    assert root["gen_ai.request.max_tokens"] == 64
    assert root["gen_ai.request.temperature"] == 0.7
    assert root["gen_ai.usage.input_tokens"] == 56
    assert root["gen_ai.usage.output_tokens"] == 3
    assert tuple(root["gen_ai.response.finish_reasons"]) == ("stop",)
    assert root["gen_ai.response.time_to_first_chunk"] == pytest.approx(record.ttft_ns / 1e9)
    assert "error.type" not in root
    assert spans["chat smollm2"].status.status_code is StatusCode.UNSET
    prefill = spans["llm.prefill"].attributes
    assert prefill["llm.num_prompt_tokens"] == 56 and prefill["llm.num_cached_tokens"] == 32
    assert prefill["llm.num_chunks"] == 2 and prefill["llm.batch_size"] == 3
    assert prefill["llm.flops_per_s"] == 1.5e12
    kv = spans["llm.kv_lookup"].attributes
    assert (kv["llm.num_hit_tokens"], kv["llm.num_hit_blocks"]) == (32, 2)
    assert spans["llm.detokenize"].attributes["llm.num_tokens"] == 2


def test_chunk_events_on_prefill_span_others_on_server_span(exported):
    builder, exporter = exported
    server = start(builder)
    record = make_record(server)
    builder.finish(server, record)
    spans = by_name(exporter)
    offset = WALL_NS - PERF_NS
    chunks = spans["llm.prefill"].events
    assert [e.name for e in chunks] == ["prefill_chunk", "prefill_chunk"]
    assert [e.timestamp - offset for e in chunks] == [record.events[0][1], record.events[1][1]]
    assert chunks[0].attributes["num_tokens"] == 16
    assert [e.name for e in spans["chat smollm2"].events] == ["preempted"]
    assert all(not spans[f"llm.{s}"].events for s in SERVER_STAGES if s != "prefill")


@pytest.mark.parametrize(("finish_reason", "error_type", "expected"), [
    ("error", "internal", "internal"), ("abort", None, "abort"), ("error", None, "error"),
    ("stop", "timeout", "timeout"),
])
def test_failed_requests_get_error_status(exported, finish_reason, error_type, expected):
    builder, exporter = exported
    server = start(builder)
    builder.finish(server, make_record(server, finish_reason=finish_reason, error_type=error_type))
    root = by_name(exporter)["chat smollm2"]
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == expected


@pytest.mark.parametrize("header", [
    None, "", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
    "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
])
def test_invalid_or_missing_traceparent_starts_a_new_trace(exported, header):
    builder, exporter = exported
    assert parse_traceparent(header) is None
    server = start(builder, traceparent=header)
    assert re.fullmatch(r"[0-9a-f]{32}", server.trace_id) and int(server.trace_id, 16) != 0
    assert server.trace_id != "0af7651916cd43dd8448eb211c80319c"
    builder.finish(server, make_record(server))
    root = by_name(exporter)["chat smollm2"]
    assert root.parent is None
    assert root.context.trace_id == int(server.trace_id, 16)


def test_future_traceparent_version_is_continued(exported):
    builder, exporter = exported
    server = start(builder, "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-ever")
    assert server.trace_id == "0af7651916cd43dd8448eb211c80319c"
    builder.finish(server, make_record(server))
    root = by_name(exporter)["chat smollm2"]
    assert root.parent.span_id == 0xB7AD6B7169203331 and root.parent.is_remote


def test_the_span_is_named_and_attributed_from_the_label_not_the_callers_attrs(exported):
    builder, exporter = exported
    server = builder.start_server_span(
        operation="chat", model="other", parent=None, start_perf_ns=PERF_NS,
        attributes={"gen_ai.request.model": "evil<script>", "gen_ai.request.top_p": 0.5})
    assert server.name == "chat other"
    assert server.attributes["gen_ai.request.model"] == "other"
    assert server.attributes["gen_ai.provider.name"] == "ttftscope"
    assert server.attributes["gen_ai.request.top_p"] == 0.5


def test_unsampled_parent_exports_nothing_and_says_so(exported):
    builder, exporter = exported
    server = start(builder, traceparent=INCOMING[:-2] + "00")
    assert str(server.traceparent).endswith("-00") and not server.sampled
    assert not server.traceparent.sampled
    builder.finish(server, make_record(server))
    assert exporter.get_finished_spans() == ()


def test_record_without_stages_still_emits_server_span(exported):
    builder, exporter = exported
    server = start(builder)
    record = RequestRecord("r2", server.trace_id, server.span_id, "smollm2", "chat",
                           PERF_NS + 1_000, PERF_NS + 9_000, finish_reason="error",
                           error_type="invalid_request", attrs={"bad": None, "obj": {"a": 1}})
    builder.finish(server, record)
    (root,) = exporter.get_finished_spans()
    assert root.status.status_code is StatusCode.ERROR
    assert "gen_ai.response.time_to_first_chunk" not in root.attributes
    assert "bad" not in root.attributes and root.attributes["obj"] == "{'a': 1}"


def test_server_kind_is_configurable():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(provider, Clock(), kind=SpanKind.SERVER)
    server = start(builder)
    builder.finish(server, make_record(server))
    kinds = {s.name: s.kind for s in exporter.get_finished_spans()}
    assert kinds.pop("chat smollm2") is SpanKind.SERVER
    assert set(kinds.values()) == {SpanKind.INTERNAL}


def test_noop_api_provider_gives_ids_and_emits_nothing():
    builder = SpanBuilder(trace_api.NoOpTracerProvider(), Clock())
    server = start(builder)
    assert server.trace_id == "0af7651916cd43dd8448eb211c80319c" and not server.sampled
    builder.finish(server, make_record(server))   # must not raise


def test_current_parent_reads_the_active_span():
    provider = TracerProvider()
    header = parse_traceparent(INCOMING)
    assert current_parent() is None and continued_parent(header) is header
    with provider.get_tracer("t").start_as_current_span("http") as span:
        ctx = span.get_span_context()
        assert current_parent() == TraceParent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", 1)
        assert continued_parent(header) == current_parent()
    provider.shutdown()


def test_the_server_span_nests_under_the_active_http_span(exported):
    # The FastAPI instrumentation's HTTP span continued the header; ours is its child.
    builder, exporter = exported
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("http") as http:
        server = start(builder)
    http_ctx = http.get_span_context()
    assert server.trace_id == f"{http_ctx.trace_id:032x}" != INCOMING[3:35]
    builder.finish(server, make_record(server))
    assert by_name(exporter)["chat smollm2"].parent.span_id == http_ctx.span_id
    provider.shutdown()


def test_make_tracer_provider_exports_only_with_an_endpoint():
    plain = make_tracer_provider(environ={})
    assert plain._active_span_processor._span_processors == ()
    assert plain.resource.attributes["service.name"] == "ttftscope"
    assert trace_api.get_tracer_provider() is not plain
    for environ, url in (
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
          "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9999/traces"}, "http://b:9999/traces"),
    ):
        provider = make_tracer_provider("svc", environ={**environ, "OTEL_SERVICE_NAME": "eng"})
        (processor,) = provider._active_span_processor._span_processors
        assert isinstance(processor, BatchSpanProcessor)
        exporter = processor._batch_processor._exporter
        assert isinstance(exporter, OTLPSpanExporter) and exporter._endpoint == url
        assert provider.resource.attributes["service.name"] == "eng"
        assert trace_api.get_tracer_provider() is not provider
        provider.shutdown()




@pytest.mark.parametrize("sampled", [True, False])
@pytest.mark.parametrize("remote", [True, False])
def test_the_default_sampler_is_answered_as_the_sdk_answers(sampled, remote):
    """`_should_sample` answers the SDK's default sampler, ParentBased(ALWAYS_ON), without
    calling it: for no parent, and for a parent with either flag, the decision the SDK makes
    for that parent as a remote and as a local span context (the continued parent a span
    builder gets is a `TraceParent`: the header's, or the active span's)."""
    from opentelemetry import context as otel_context
    from opentelemetry.sdk.trace.sampling import DEFAULT_ON
    from opentelemetry.trace import SpanContext, TraceFlags

    provider = TracerProvider(sampler=DEFAULT_ON)
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    builder = SpanBuilder(provider, Clock())
    parent = TraceParent(f"{0xABC:032x}", f"{0xDEF:016x}", int(sampled))
    sdk_parent = SpanContext(0xABC, 0xDEF, is_remote=remote, trace_flags=TraceFlags(int(sampled)))
    for ours, ctx in ((None, None), (parent, sdk_parent)):
        parent_ctx = None if ctx is None else trace_api.set_span_in_context(
            trace_api.NonRecordingSpan(ctx), otel_context.Context())
        expected = DEFAULT_ON.should_sample(parent_ctx, 0xABC, "chat m", SpanKind.INTERNAL,
                                            {}).decision.is_sampled()
        assert builder._should_sample(ours, 0xABC, "chat m", {}) is expected
