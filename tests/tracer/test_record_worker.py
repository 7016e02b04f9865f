"""The tracer's background worker (tracer/core/record_worker.py): under load from several
threads every record's spans, metric observations and log line arrive, in finish order per
sink; a full queue blocks instead of dropping; a raising sink is counted and the worker goes
on; `drain` is the read-your-writes barrier of the scrape; shutdown drains."""
from __future__ import annotations

import io
import json
import threading
import time

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.core.record_worker import RecordWorker
from tracer.core.request_tracer import Tracer
from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.record.clock import Clock
from tracer.record.stages import SERVER_STAGES
from tracer.sinks.logs import RequestLogSink, configure_logging
from tracer.sinks.metrics import LLMMetrics
from tracer.sinks.spans import SpanBuilder
from tracer.sinks.store import TraceStore
from tracer.testing.sinks import CapturingSink, RaisingSink
from tracer.web.observability import ObservabilitySettings, build_observability

MODEL = "m"
NUM_THREADS = 6
REQUESTS_PER_THREAD = 120
NUM_TOKENS = 4


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    """Poll `predicate` until it holds or `timeout_s` passes (a bounded wait, not a sleep)."""
    deadline, tick = time.monotonic() + timeout_s, threading.Event()
    while time.monotonic() < deadline:
        if predicate():
            return True
        tick.wait(0.002)
    return predicate()


class OrderedMetrics(LLMMetrics):
    """The real metrics sink, also noting the order it observed the requests in."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.order: list[str] = []

    def observe_request(self, record, batch=None) -> None:
        self.order.append(record.request_id)
        super().observe_request(record, batch)


class GateSink:
    """Holds the worker on each record until `gate` is set."""

    name = "gate"

    def __init__(self) -> None:
        self.gate = threading.Event()

    def publish(self, record) -> None:
        assert self.gate.wait(30), "the test never opened the gate"


def run_request(tracer: Tracer, rid: str, t0: int) -> None:
    active = tracer.begin(request_id=rid, model=MODEL, operation="chat", traceparent=None,
                          start_ns=t0)
    for i, stage in enumerate(SERVER_STAGES):
        active.timeline.mark(stage, t0 + (i + 1) * 1_000)
    for k in range(NUM_TOKENS):
        active.timeline.emit(t0 + 20_000 + k * 1_000)
    tracer.finish(active, end_ns=t0 + 40_000, finish_reason="stop", num_prompt_tokens=8,
                  num_output_tokens=NUM_TOKENS)


def test_under_load_every_span_metric_and_log_line_arrives_in_finish_order():
    exporter, registry, log = InMemorySpanExporter(), CollectorRegistry(), io.StringIO()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    builder = SpanBuilder(provider, Clock())
    total = NUM_THREADS * REQUESTS_PER_THREAD
    store = TraceStore(total)
    metrics = OrderedMetrics(registry, model_names=(MODEL,))
    # The sinks and order build_observability wires; a queue of 8 so the six finishing
    # threads outrun the worker and have to wait for room.
    tracer = Tracer(model_names=(MODEL,), span_builder=builder, background=True, max_pending=8,
                    sinks=[store, metrics, builder,
                           RequestLogSink(configure_logging("json", log))])
    failures: list[BaseException] = []

    def finish_many(thread_no: int) -> None:
        try:
            for i in range(REQUESTS_PER_THREAD):
                run_request(tracer, f"t{thread_no}-r{i}", 1_000_000 * (i + 1))
        except BaseException as exc:   # surfaces in the main thread's assert
            failures.append(exc)

    threads = [threading.Thread(target=finish_many, args=(n,)) for n in range(NUM_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and failures == []
    assert tracer.drain(60) and tracer.num_active == 0 and tracer.num_sink_errors == 0

    # The finish order: the store's, which `finish` fills inline, under the same lock that
    # hands the record to the worker.
    finish_order = [r.request_id for r in reversed(store.recent(total))]
    assert len(finish_order) == len(set(finish_order)) == total

    assert metrics.order == finish_order
    sample = registry.get_sample_value
    labels = {"gen_ai_request_model": MODEL, "gen_ai_operation_name": "chat"}
    assert sample("gen_ai_server_time_to_first_token_seconds_count", labels) == total
    assert sample("llm_requests_total", {"model": MODEL, "finish_reason": "stop"}) == total
    assert sample("llm_inter_token_latency_seconds_count", {"model": MODEL}) == \
        total * (NUM_TOKENS - 1)
    assert sample("llm_request_stage_duration_seconds_count", {"stage": "prefill"}) == total

    spans = exporter.get_finished_spans()
    assert len(spans) == total * (1 + len(SERVER_STAGES))
    server_spans = [s for s in spans if s.name == f"chat {MODEL}"]
    assert [s.attributes["llm.request_id"] for s in server_spans] == finish_order
    # each request's stage spans come right before its own server span
    for i, server in enumerate(server_spans):
        block = spans[i * (1 + len(SERVER_STAGES)):(i + 1) * (1 + len(SERVER_STAGES))]
        assert block[-1] is server
        assert [s.name for s in block[:-1]] == [f"llm.{stage}" for stage in SERVER_STAGES]
        assert {s.parent.span_id for s in block[:-1]} == {server.context.span_id}

    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == finish_order
    assert {line["event"] for line in lines} == {"request_finished"}


def test_a_full_queue_blocks_the_finishing_thread_and_loses_nothing():
    gate, captured = GateSink(), CapturingSink()
    worker = RecordWorker([gate, captured], on_failure=lambda sink, exc: None, max_pending=2)
    worker.submit(0)   # the worker takes it and waits at the gate
    worker.submit(1)   # two pending: the queue is full
    third = threading.Thread(target=worker.submit, args=(2,))
    third.start()
    assert wait_for(lambda: worker.num_waiting_submitters == 1), "submit did not wait for room"
    assert third.is_alive() and captured.records == [] and worker.num_pending == 2
    gate.gate.set()
    third.join(10)
    assert not third.is_alive()
    assert worker.flush(10) and captured.records == [0, 1, 2]
    assert worker.num_blocked == 1 and worker.num_published == 3
    assert worker.close(10)


def test_a_raising_sink_is_counted_and_the_worker_goes_on():
    broken, after = RaisingSink(), CapturingSink()
    tracer = Tracer(model_names=(MODEL,), sinks=[broken, after], background=True)
    for i in range(3):
        run_request(tracer, f"r{i}", 1_000_000)
    assert tracer.drain(10)
    assert tracer.sink_failures == {"raising": 3} and tracer.num_sink_errors == 3
    assert broken.calls == 3 and [r.request_id for r in after.records] == ["r0", "r1", "r2"]
    run_request(tracer, "r3", 1_000_000)   # the worker thread is still there
    assert tracer.drain(10) and after.records[-1].request_id == "r3" and tracer.num_active == 0
    assert tracer.close(10)


def test_only_the_inline_store_runs_inside_finish():
    gate, captured = GateSink(), CapturingSink()
    store = TraceStore(8)
    tracer = Tracer(model_names=(MODEL,), sinks=[store, gate, captured], background=True)
    run_request(tracer, "r0", 1_000_000)
    # The worker is held at the gate, and still the record is in the store (the probe join
    # and /ui need it the moment the response ends) and the request counts as active.
    assert store.get_by_request_id("r0") is not None
    assert captured.records == [] and tracer.num_active == 1
    assert not tracer.drain(0.01)   # a bounded barrier: False while the gate holds
    assert not tracer.is_idle(0.01)
    gate.gate.set()
    assert tracer.drain(10) and [r.request_id for r in captured.records] == ["r0"]
    assert tracer.num_active == 0 and tracer.close(10)


def test_is_idle_drains_a_lingering_worker_instead_of_waiting_for_it():
    captured = CapturingSink()
    tracer = Tracer(model_names=(MODEL,), sinks=[captured], background=True)
    tracer.worker.linger_s = 3600.0   # without the drain the record would wait an hour
    run_request(tracer, "r0", 1_000_000)
    assert tracer.is_idle(10) and [r.request_id for r in captured.records] == ["r0"]
    assert tracer.close(10)


def test_the_scrape_waits_for_the_requests_finished_before_it():
    """Through build_observability: /metrics reads the registry after the worker's drain."""
    obs = build_observability(ObservabilitySettings(), model_names=(MODEL,))
    gate = GateSink()
    worker = obs.tracer.worker
    worker.sinks = (gate, *worker.sinks)   # hold the worker before it reaches the metrics
    run_request(obs.tracer, "r0", 1_000_000)
    scraped: list[bytes] = []
    reader = threading.Thread(target=lambda: scraped.append(obs.metrics.exposition(None)[0]))
    reader.start()
    assert wait_for(lambda: worker.num_flushing == 1), "the scrape did not wait for the worker"
    assert reader.is_alive() and scraped == []
    gate.gate.set()
    reader.join(10)
    assert b'llm_requests_total{finish_reason="stop",model="m"} 1.0' in scraped[0]
    assert obs.close()


def test_close_drains_and_a_later_record_starts_the_worker_again():
    gate, captured = GateSink(), CapturingSink()
    worker = RecordWorker([gate, captured], on_failure=lambda sink, exc: None)
    for i in range(50):
        worker.submit(i)
    closing = threading.Thread(target=worker.close)
    closing.start()
    gate.gate.set()
    closing.join(10)
    assert not closing.is_alive() and captured.records == list(range(50))
    assert not worker.is_running
    worker.submit(50)
    assert worker.flush(10) and captured.records[-1] == 50 and worker.close(10)


def test_a_sink_flushing_its_own_worker_does_not_deadlock():
    results: list[bool] = []

    class Flusher:
        def publish(self, record) -> None:
            results.append(worker.flush(10))

    worker = RecordWorker([Flusher()], on_failure=lambda sink, exc: None)
    worker.submit("r")
    assert worker.flush(10) and results == [False] and worker.close(10)


def test_the_proxy_lifespan_drains_the_tracer_on_shutdown():
    parts = create_proxy_app(ProxySettings("http://127.0.0.1:9", upstream_metrics_path=None),
                             model_names=(MODEL,), registry=CollectorRegistry(),
                             tracer_provider=TracerProvider())
    tracer = parts.obs.tracer
    gate = GateSink()
    tracer.worker.sinks = (gate, *tracer.worker.sinks)
    # The gate opens only once the shutdown has asked the worker to close.
    opener = threading.Thread(target=lambda: wait_for(lambda: tracer.worker.is_closing, 30)
                              and gate.gate.set())
    with TestClient(parts.app):
        run_request(tracer, "r0", 1_000_000)
        assert tracer.num_active == 1   # held at the gate
        opener.start()
    opener.join(10)
    # The lifespan's shutdown published the record and stopped the thread.
    assert gate.gate.is_set() and tracer.num_active == 0 and tracer.worker.num_pending == 0
    assert not tracer.worker.is_running
    sample = parts.obs.registry.get_sample_value
    assert sample("llm_requests_total", {"model": MODEL, "finish_reason": "stop"}) == 1


def test_a_batch_goes_sink_by_sink_and_a_small_one_record_by_record():
    """From MIN_SINK_BATCH records a batch reaches each sink whole before the next sink (its
    code and state stay warm); below, record by record. Either way every sink sees every
    record in order, after every sink before it."""
    from tracer.core.record_worker import MIN_SINK_BATCH
    seen: list[tuple[str, int]] = []

    class Named:
        def __init__(self, name):
            self.name = name

        def publish(self, record):
            seen.append((self.name, record))

    worker = RecordWorker([Named("a"), Named("b")], on_failure=lambda sink, exc: None)
    small = list(range(MIN_SINK_BATCH - 1))
    worker._publish_batch(small)
    assert seen == [(name, r) for r in small for name in "ab"]
    seen.clear()
    big = list(range(MIN_SINK_BATCH + 2))
    worker._publish_batch(big)
    assert seen == [(name, r) for name in "ab" for r in big]


def test_records_finished_within_the_linger_share_one_trip_and_a_flush_ends_it():
    """The first record wakes the worker, which waits out the linger for company (a record
    published alone runs cold: docs/figures.md); the records that come meanwhile ride
    along, and `flush` ends the wait at once."""
    trips: list[int] = []
    seen: list[int] = []

    class Sink:
        def publish(self, record):
            seen.append(record)

    worker = RecordWorker([Sink()], on_failure=lambda sink, exc: None,
                          on_published=trips.append, linger_s=3600.0)
    for i in range(3):
        worker.submit(i)
    assert worker.flush(timeout_s=10)      # long before the linger's end
    assert seen == [0, 1, 2] and trips == [3]
    assert worker.close(timeout_s=10)
