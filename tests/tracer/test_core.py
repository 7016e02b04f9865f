"""Tracer facade: trace continuation, record building, publishing once, disabled mode."""
from __future__ import annotations

import io
import json
import random
import threading
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.core.request_tracer import Tracer
from tracer.record.labels import OTHER
from tracer.sinks.logs import RequestLogSink, configure_logging
from tracer.sinks.metrics import LLMMetrics
from tracer.record.clock import Clock
from tracer.sinks.spans import SpanBuilder
from tracer.record.stages import SERVER_STAGES
from tracer.sinks.store import TraceStore
from tracer.record.timeline import NullTimeline
from tracer.testing.sinks import CapturingSink, RaisingSink
from tracer.record.traceparent import TraceParent, parse_server_timing, parse_traceparent
from tracer.web.openai_http import parent_traceparent_of

MODEL = "smollm2"
INCOMING_HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
INCOMING = parse_traceparent(INCOMING_HEADER)


class FakeMetrics:
    def __init__(self):
        self.records = []

    def publish(self, record):
        self.records.append(record)


@dataclass
class FakeServerSpan:
    traceparent: TraceParent


class FakeSpanBuilder:
    """A `ServerSpanStarter` (tracer/core/span_builder.py) as tracer.sinks.spans.SpanBuilder
    keeps it: continue the parent, else new ids; the name from the operation and the label."""

    def __init__(self):
        self.started, self.finished = [], []
        self._rng = random.Random(1)

    def start_server_span(self, *, operation, model, parent, start_perf_ns, attributes):
        trace_id = parent.trace_id if parent else f"{self._rng.getrandbits(128) | 1:032x}"
        span_id = f"{self._rng.getrandbits(64) | 1:016x}"
        span = FakeServerSpan(TraceParent(trace_id, span_id, 1))
        self.started.append((f"{operation} {model}", parent, start_perf_ns, dict(attributes),
                             span))
        return span

    def publish(self, record):
        if record.span_handle is not None:
            self.finished.append((record.span_handle, record))


def _run_stages(timeline, start_ns: int, step_ns: int = 100) -> int:
    t_ns = start_ns
    for stage in SERVER_STAGES:
        t_ns += step_ns
        timeline.mark(stage, t_ns)
    timeline.emit(t_ns)
    timeline.emit(t_ns + 1_000)
    timeline.emit(t_ns + 3_000)
    return t_ns


def _fake_tracer(**kwargs):
    metrics, spans, buf = FakeMetrics(), FakeSpanBuilder(), io.StringIO()
    sinks = [TraceStore(), metrics, spans, RequestLogSink(configure_logging("json", buf))]
    tracer = Tracer(model_names=(MODEL,), sinks=sinks, span_builder=spans, **kwargs)
    return tracer, metrics, spans, buf


def store_of(tracer) -> TraceStore:
    return next(sink for sink in tracer.sinks if isinstance(sink, TraceStore))


def test_begin_continues_a_valid_incoming_trace():
    tracer, _, spans, _ = _fake_tracer()
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=INCOMING, start_ns=10, attrs={"gen_ai.request.max_tokens": 8})
    name, parent, start_ns, attrs, _ = spans.started[0]
    assert (name, parent, start_ns) == (f"chat {MODEL}", INCOMING, 10)
    assert attrs == {"gen_ai.request.max_tokens": 8}
    assert active.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert active.span_id != "00f067aa0ba902b7"
    assert parse_server_timing(active.server_timing) == active.traceparent
    assert parse_traceparent(active.traceparent).span_id == active.span_id
    assert active.record is None
    assert tracer.num_active == 1


@pytest.mark.parametrize("bad", ["", "nonsense", INCOMING_HEADER.upper(),
                                 "ff" + INCOMING_HEADER[2:],
                                 f"00-{'0' * 32}-00f067aa0ba902b7-01"])
def test_invalid_traceparent_is_ignored_and_a_new_trace_starts(bad):
    tracer, _, spans, _ = _fake_tracer()
    parent = parent_traceparent_of({"headers": [(b"traceparent", bad.encode())]})
    assert parent is None   # the HTTP edge parses it once; begin gets the parsed form
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=parent, start_ns=0)
    assert spans.started[0][1] is None
    assert active.trace_id != "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse_traceparent(active.traceparent) is not None


def test_without_a_span_builder_ids_are_made_locally_and_continue_the_trace():
    tracer = Tracer(model_names=(MODEL,), rng=random.Random(3))
    continued = tracer.begin(request_id="a", model=MODEL, operation="chat",
                             traceparent=INCOMING, start_ns=0)
    fresh = tracer.begin(request_id="b", model=MODEL, operation="chat",
                         traceparent=None, start_ns=0)
    assert continued.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert fresh.trace_id != continued.trace_id
    assert parse_traceparent(fresh.traceparent).trace_id == fresh.trace_id


def test_finish_builds_the_record_and_publishes_it_everywhere():
    tracer, metrics, spans, buf = _fake_tracer()
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=None, start_ns=1_000, attrs={"stream": True})
    send_ns = _run_stages(active.timeline, 1_000)
    active.timeline.stage_attr("kv_lookup", "num_hit_tokens", 16)
    active.timeline.event("prefill_chunk", 1_600, start_ns=1_500, num_tokens=32)
    active.attrs["late"] = 1          # attrs stay mutable until finish
    record = tracer.finish(active, end_ns=send_ns + 4_000, finish_reason="stop",
                           num_prompt_tokens=32, num_cached_tokens=16, num_output_tokens=3)
    assert [s.stage for s in record.stages] == list(SERVER_STAGES)
    assert record.ttft_ns == 900 and record.unattributed_ns == 0
    assert record.itl.first_ns == (1_000, 2_000) and record.tpot_ns == 1_500
    assert record.e2e_ns == send_ns + 4_000 - 1_000
    assert record.stage_ns("kv_lookup") == 100
    assert record.stages[3].attrs == {"num_hit_tokens": 16}
    assert record.events == (("prefill_chunk", 1_600, {"start_ns": 1_500, "num_tokens": 32}),)
    assert record.attrs == {"stream": True, "late": 1}
    assert (record.trace_id, record.span_id) == (active.trace_id, active.span_id)
    assert record.source == "engine" and record.model == MODEL
    assert store_of(tracer).get(active.trace_id) is record
    assert metrics.records == [record]
    assert spans.finished == [(spans.started[0][4], record)]
    line = json.loads(buf.getvalue())
    assert line["request_id"] == "r1" and line["ttft_ms"] == 0.0009
    assert active.record is record
    assert tracer.num_active == 0


def test_finish_is_idempotent():
    tracer, metrics, spans, buf = _fake_tracer()
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=None, start_ns=0)
    _run_stages(active.timeline, 0)
    first = tracer.finish(active, end_ns=5_000, finish_reason="stop")
    second = tracer.finish(active, end_ns=9_999, finish_reason="abort", error_type="x")
    assert second is first and first.finish_reason == "stop" and first.end_ns == 5_000
    assert len(metrics.records) == 1 and len(spans.finished) == 1 and len(store_of(tracer)) == 1
    assert len(buf.getvalue().splitlines()) == 1
    assert tracer.num_active == 0


def test_concurrent_finishes_publish_once():
    tracer, metrics, spans, _ = _fake_tracer()
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=None, start_ns=0)
    barrier, results = threading.Barrier(4), []

    def finish():
        barrier.wait()
        results.append(tracer.finish(active, end_ns=10, finish_reason="abort"))

    threads = [threading.Thread(target=finish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert len(metrics.records) == 1 and len(spans.finished) == 1
    assert tracer.num_active == 0


def test_aborted_request_without_a_token_has_no_ttft_and_partial_stages():
    tracer, metrics, _, buf = _fake_tracer()
    active = tracer.begin(request_id="r1", model=MODEL, operation="text_completion",
                          traceparent=None, start_ns=0)
    active.timeline.mark("receive", 5)
    active.timeline.mark("template", 7)
    record = tracer.finish(active, end_ns=50, finish_reason="abort",
                           error_type="client_disconnect")
    assert record.ttft_ns is None and record.itl.count == 0
    assert [s.stage for s in record.stages] == ["receive", "template"]
    assert json.loads(buf.getvalue())["level"] == "warning"


def test_unserved_model_never_reaches_the_record():
    tracer, metrics, spans, _ = _fake_tracer()
    active = tracer.begin(request_id="r1", model="evil-" + "x" * 50, operation="chat",
                          traceparent=None, start_ns=0)
    assert active.model == OTHER and spans.started[0][0] == "chat other"
    assert tracer.finish(active, end_ns=1, finish_reason="error").model == OTHER
    with pytest.raises(AttributeError):
        active.model = "evil"          # folded once at begin: no later write gets past it


def test_a_raw_model_never_reaches_a_span_name():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(provider, Clock())
    tracer = Tracer(model_names=(MODEL,), span_builder=builder, sinks=[builder])
    active = tracer.begin(request_id="r1", model="evil<script>", operation="chat",
                          traceparent=None, start_ns=0,
                          attrs={"gen_ai.request.model": "evil<script>"})
    tracer.finish(active, end_ns=1, finish_reason="stop")
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat other" and span.attributes["gen_ai.request.model"] == "other"
    assert "evil<script>" not in repr(dict(span.attributes))
    provider.shutdown()


def test_begin_takes_the_parsed_traceparent_only():
    tracer, *_ = _fake_tracer()
    with pytest.raises(TypeError):
        tracer.begin(request_id="r1", model=MODEL, operation="chat",
                     traceparent=INCOMING_HEADER, start_ns=0)


def test_unknown_operation_is_a_programming_error():
    tracer, *_ = _fake_tracer()
    with pytest.raises(ValueError):
        tracer.begin(request_id="r1", model=MODEL, operation="embed", traceparent=None,
                     start_ns=0)


def test_a_failing_sink_does_not_stop_the_others(caplog):
    spans, buf, broken, after = FakeSpanBuilder(), io.StringIO(), RaisingSink(), CapturingSink()
    tracer = Tracer(model_names=(MODEL,), span_builder=spans, sinks=[
        TraceStore(), broken, spans, RequestLogSink(configure_logging("json", buf)), after])
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat", traceparent=None,
                          start_ns=0)
    record = tracer.finish(active, end_ns=1, finish_reason="stop")
    assert tracer.num_sink_errors == 1 and tracer.sink_failures == {"raising": 1}
    assert broken.calls == 1 and after.records == [record]
    assert store_of(tracer).get(record.trace_id) is record
    assert len(spans.finished) == 1 and len(buf.getvalue().splitlines()) == 1
    assert "the raising sink failed" in caplog.text


def test_disabled_mode_records_nothing_but_keeps_usable_ids():
    tracer, metrics, spans, buf = _fake_tracer(enabled=False)
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=INCOMING, start_ns=0)
    assert isinstance(active.timeline, NullTimeline)
    assert active.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse_server_timing(active.server_timing) == active.traceparent
    _run_stages(active.timeline, 0)
    record = tracer.finish(active, end_ns=10_000, finish_reason="stop", num_output_tokens=3)
    assert record.request_id == "r1" and record.num_output_tokens == 3
    assert record.stages == () and record.ttft_ns is None
    assert tracer.finish(active, end_ns=1, finish_reason="abort") is record
    assert len(store_of(tracer)) == 0 and metrics.records == [] and spans.started == []
    assert spans.finished == [] and buf.getvalue() == "" and tracer.num_active == 0


def _sample(registry, name, labels):
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_real_otel_metrics_store_and_logs_together():
    exporter, registry, buf = InMemorySpanExporter(), CollectorRegistry(), io.StringIO()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = Clock(wall_ns=1_700_000_000_000_000_000, perf_ns=0)
    builder = SpanBuilder(provider, clock)
    tracer = Tracer(model_names=(MODEL,), span_builder=builder, sinks=[
        TraceStore(8), LLMMetrics(registry, model_names=(MODEL,)), builder,
        RequestLogSink(configure_logging("json", buf))])
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=INCOMING, start_ns=1_000_000)
    send_ns = _run_stages(active.timeline, 1_000_000, step_ns=1_000_000)
    record = tracer.finish(active, end_ns=send_ns + 5_000_000, finish_reason="stop",
                           num_prompt_tokens=20, num_cached_tokens=4, num_output_tokens=3)
    tracer.finish(active, end_ns=send_ns + 9_000_000, finish_reason="stop")   # no-op

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert len(exporter.get_finished_spans()) == 1 + len(SERVER_STAGES)
    server = spans[f"chat {MODEL}"]
    assert f"{server.context.trace_id:032x}" == record.trace_id == INCOMING.trace_id
    assert f"{server.context.span_id:016x}" == record.span_id
    assert f"{server.parent.span_id:016x}" == INCOMING.span_id
    for stage in record.stages:
        child = spans[f"llm.{stage.stage}"]
        assert child.parent.span_id == server.context.span_id
        assert child.start_time == clock.to_epoch_ns(stage.start_ns)
        assert child.end_time - child.start_time == stage.duration_ns == 1_000_000

    ttft_labels = {"gen_ai_request_model": MODEL, "gen_ai_operation_name": "chat"}
    assert _sample(registry, "gen_ai_server_time_to_first_token_seconds_count", ttft_labels) == 1
    assert _sample(registry, "gen_ai_server_time_to_first_token_seconds_sum",
                   ttft_labels) == pytest.approx(0.009)
    assert _sample(registry, "llm_request_stage_duration_seconds_count", {"stage": "prefill"}) == 1
    assert _sample(registry, "llm_requests_total",
                   {"model": MODEL, "finish_reason": "stop"}) == 1
    assert store_of(tracer).get(record.trace_id) is record
    assert len(buf.getvalue().splitlines()) == 1
    assert tracer.num_sink_errors == 0


def test_a_failing_span_start_still_yields_ids_and_a_record(caplog):
    class BrokenStart(FakeSpanBuilder):
        def start_server_span(self, **kwargs):
            raise RuntimeError("sampler exploded")

    spans = BrokenStart()
    tracer = Tracer(model_names=(MODEL,), span_builder=spans, sinks=[TraceStore(), spans])
    active = tracer.begin(request_id="r1", model=MODEL, operation="chat",
                          traceparent=INCOMING, start_ns=0)
    assert active.trace_id == INCOMING.trace_id
    assert parse_traceparent(active.traceparent).span_id == active.span_id
    record = tracer.finish(active, end_ns=1, finish_reason="stop")
    assert store_of(tracer).get(active.trace_id) is record
    assert spans.finished == [] and tracer.num_sink_errors == 1
    assert "sampler exploded" in caplog.text


def test_the_beacon_token_is_signed_on_first_read_of_server_timing_and_once():
    """A proxy reads `server_timing` after the request went upstream, so the HMAC is not on
    the request's way out (tracer/proxy/serving.py)."""
    signed: list[str] = []

    def token(trace_id: str) -> str:
        signed.append(trace_id)
        return "ab12"
    tracer = Tracer(model_names=("m",), beacon_token=token)
    active = tracer.begin(request_id="r1", model="m", operation="chat", traceparent=None,
                          start_ns=0)
    assert signed == []
    assert active.server_timing == f"trace;desc={active.traceparent}, beacon;desc=ab12"
    assert active.server_timing.endswith("beacon;desc=ab12")
    assert signed == [active.trace_id]
