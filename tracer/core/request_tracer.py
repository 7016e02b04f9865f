"""The facade the server and the proxy use: begin a request, finish it, publish the record.

`begin` is on the request path (before the first token), so it only folds the model to its
label, fixes the ids (continuing the parent `TraceParent` the HTTP edge parsed) and allocates
a `Timeline`. `finish` runs after the response: it builds the record with the timeline's
snapshot, whose attribution its first reader works out (normally the worker:
tracer/record/deferred_timing.py), and publishes it. With `background=True` (what
`build_observability` builds) only the sinks marked `inline` run on the finishing thread;
the costly ones (metrics, spans, the log line) get the record from a `RecordWorker` thread,
in finish order, and `drain()` is the barrier readers use. docs/architecture.md follows one
request through it.
"""
from __future__ import annotations

import logging
import random
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence

from tracer.core.record_worker import DEFAULT_MAX_PENDING, RecordWorker
from tracer.core.sink import RecordSink, is_inline, sink_name
from tracer.core.span_builder import ServerSpanHandle, ServerSpanStarter
from tracer.record.labels import model_label
from tracer.record.deferred_timing import DeferredRecord, deferred_record
from tracer.record.request_record import RequestRecord
from tracer.record.stages import OPERATIONS, SERVER_STAGES
from tracer.record.timeline import NullTimeline, Timeline
from tracer.record.traceparent import (
    TraceParent,
    format_traceparent,
    new_span_id,
    new_trace_id,
    server_timing_value,
)

_internal_log = logging.getLogger(__name__)


class ActiveRequest:
    """A request between `Tracer.begin` and `Tracer.finish`.

    `timeline` takes the stage marks; `traceparent`/`server_timing` are the server span's
    context for the `Server-Timing` response header (`server_timing` is signed on first
    read: a proxy reads it after the request went upstream, so the HMAC runs while the
    upstream works, not before the request leaves); `model` is the label `begin` folded
    (a served name or `other`) and is read-only, so no later write can bring a request's
    string into the record; `attrs` may be updated until `finish`.

    >>> tracer = Tracer(model_names=("smollm2",))
    >>> active = tracer.begin(request_id="r1", model="smollm2", operation="chat",
    ...                       traceparent=None, start_ns=0)
    >>> active.server_timing == "trace;desc=" + active.traceparent
    True
    """

    __slots__ = ("request_id", "_model", "operation", "timeline", "trace_id", "span_id",
                 "traceparent", "attrs", "_server_span", "_beacon_token", "_server_timing",
                 "_record", "_lock", "prompt_source", "block_source", "upstream_span_id",
                 "__weakref__")

    def __init__(self, *, request_id: str, model: str, operation: str, timeline,
                 trace_id: str, span_id: str, traceparent: str, attrs: dict,
                 server_span=None,
                 beacon_token: Callable[[str], str] | None = None) -> None:
        self.request_id = request_id
        self._model = model
        self.operation = operation
        self.timeline = timeline
        self.trace_id = trace_id
        self.span_id = span_id
        self.traceparent = traceparent
        self._beacon_token = beacon_token   # trace id -> token; None: no beacon token
        self._server_timing: str | None = None
        self.attrs = attrs
        self._server_span = server_span
        self._record: RequestRecord | None = None
        self._lock = threading.Lock()   # finish may race (abort vs. normal end): run it once
        # The prompt by reference (RequestRecord.prompt_source): no copy on the request path.
        self.prompt_source: object = None
        # What the engine reported of the prompt's blocks (RequestRecord.block_source).
        self.block_source: object = None
        # The parent span id the upstream was sent, when it differs from `span_id`: the
        # engine join's secret (tracer/proxy/engine_join.py); "" until set.
        self.upstream_span_id = ""

    @property
    def model(self) -> str:
        """The model label: a served name or `other` (tracer.record.labels.model_label)."""
        return self._model

    @property
    def server_timing(self) -> str:
        """The `Server-Timing` value: the span's context and the beacon token, if any."""
        if self._server_timing is None:
            token = None if self._beacon_token is None else self._beacon_token(self.trace_id)
            self._server_timing = server_timing_value(self.traceparent, token)
        return self._server_timing

    @property
    def record(self) -> RequestRecord | None:
        """The finished record, once `finish` has run."""
        return self._record


class Tracer:
    """Per-request tracing: timeline → attribution → record → each `RecordSink` in turn.

    `sinks` receive every finished record, in order; one that raises is counted
    (`sink_failures`) and logged, and the others still run. With `background`, the sinks
    not marked `inline` (`tracer.core.sink.is_inline`) are published from one worker thread
    (`tracer.core.record_worker`), still in finish order, with at most `max_pending` records
    waiting (then `finish` waits: nothing is dropped); `drain()` waits for them and `close()`
    stops the thread. Without it every sink runs inside `finish`. `span_builder`
    (a `ServerSpanStarter`), when given, starts the request's span at `begin` (so ids and
    the sampling decision come from the OTel provider); it is usually one of the sinks too,
    and finishes the span from the record. `enabled=False` keeps ids and headers working but
    records nothing, for overhead A/B runs.

    >>> from tracer.testing.sinks import CapturingSink
    >>> captured = CapturingSink()
    >>> tracer = Tracer(model_names=("smollm2",), stages=("receive", "send"), sinks=[captured])
    >>> active = tracer.begin(request_id="r1", model="smollm2", operation="chat",
    ...                       traceparent=None, start_ns=1_000)
    >>> active.timeline.mark("receive", 1_400); active.timeline.emit(2_000)
    >>> record = tracer.finish(active, end_ns=2_500, finish_reason="stop", num_output_tokens=1)
    >>> record.ttft_ns, [s.stage for s in record.stages], captured.records == [record]
    (1000, ['receive', 'send'], True)
    """

    def __init__(self, *, model_names: Iterable[str], sinks: Sequence[RecordSink] = (),
                 span_builder: ServerSpanStarter | None = None,
                 stages: tuple[str, ...] = SERVER_STAGES,
                 source: str = "engine", enabled: bool = True,
                 rng: random.Random | None = None,
                 beacon_token: Callable[[str], str] | None = None,
                 background: bool = False, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.model_names = tuple(model_names)
        self._served = frozenset(self.model_names)
        self.sinks = tuple(sinks)
        self.worker: RecordWorker | None = None
        self._inline_sinks = self.sinks
        if background:
            self._inline_sinks = tuple(s for s in self.sinks if is_inline(s))
            deferred = [s for s in self.sinks if not is_inline(s)]
            if deferred:
                self.worker = RecordWorker(deferred, on_failure=self._sink_failed,
                                           on_published=self._published,
                                           max_pending=max_pending)
        # One finish order for every sink: the inline sinks and the worker's queue see the
        # records in the same order even when two threads finish at once.
        self._publish_lock = threading.Lock()
        self.span_builder = span_builder
        self.stages = tuple(stages)
        self.source = source
        self.enabled = enabled
        self._rng = rng
        # trace id -> the token the browser's beacon must return (tracer/web/probe/token.py)
        self._beacon_token = beacon_token
        # sink name → times it raised; tests assert it stays empty
        self.sink_failures: dict[str, int] = {}
        # A count, and weak references to the requests in flight (the neighbours of a slow
        # one, tracer/core/neighbourhood.py): a request that never finishes pins no memory.
        self._num_active = 0
        self._in_flight: dict[str, weakref.ref] = {}
        self._count_lock = threading.Lock()

    def begin(self, *, request_id: str, model: str, operation: str,
              traceparent: TraceParent | None, start_ns: int,
              attrs: dict | None = None) -> ActiveRequest:
        """Start tracing a request that arrived at `start_ns` (perf_counter_ns).

        `traceparent` is the parent the HTTP edge parsed (tracer.web.openai_http), continued;
        None starts a new trace. `model` is folded here, once, to its label: a model nobody
        serves is `other` in the span name, the record and every label.
        """
        if operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, got {operation!r}")
        if traceparent is not None and not isinstance(traceparent, TraceParent):
            raise TypeError("traceparent must be a parsed TraceParent or None, got "
                            f"{type(traceparent).__name__}")
        model = model_label(model, self._served)
        attrs = {} if attrs is None else attrs
        server_span = None
        if self.enabled and self.span_builder is not None:
            server_span = self._start_span(traceparent, model, operation, start_ns, attrs)
        if server_span is not None:
            own = server_span.traceparent
            trace_id, span_id, traceparent_out = own.trace_id, own.span_id, str(own)
        else:
            parent = traceparent
            trace_id = new_trace_id(self._rng) if parent is None else parent.trace_id
            span_id = new_span_id(self._rng)
            sampled = True if parent is None else parent.sampled
            traceparent_out = format_traceparent(trace_id, span_id, sampled)
        timeline = Timeline(start_ns) if self.enabled else NullTimeline(start_ns)
        with self._count_lock:
            self._num_active += 1
        active = ActiveRequest(request_id=request_id, model=model, operation=operation,
                               timeline=timeline, trace_id=trace_id, span_id=span_id,
                               traceparent=traceparent_out, attrs=attrs, server_span=server_span,
                               beacon_token=self._beacon_token)
        if self.enabled:
            in_flight = self._in_flight
            def forget(ref, rid=request_id):   # a reused request id keeps its newest entry
                if in_flight.get(rid) is ref:
                    in_flight.pop(rid, None)
            in_flight[request_id] = weakref.ref(active, forget)
        return active

    def in_flight(self) -> list[ActiveRequest]:
        """The requests begun and not finished yet (any thread; a copy)."""
        refs = self._in_flight.copy()     # a C-level copy: atomic against begin and finish
        return [a for ref in refs.values() if (a := ref()) is not None and a._record is None]

    def _start_span(self, parent: TraceParent | None, model: str, operation: str,
                    start_ns: int, attrs: dict) -> ServerSpanHandle | None:
        try:
            return self.span_builder.start_server_span(
                operation=operation, model=model, parent=parent, start_perf_ns=start_ns,
                attributes=attrs)
        except Exception:
            # No span, but the request still gets ids (made locally) and is recorded.
            self._count_failure(self.span_builder)
            _internal_log.exception("ttftscope: starting the server span failed")
            return None

    def finish(self, active: ActiveRequest, *, end_ns: int, finish_reason: str,
               error_type: str | None = None, num_prompt_tokens: int = 0,
               num_cached_tokens: int = 0, num_output_tokens: int = 0,
               num_draft_tokens: int = 0, num_draft_accepted: int = 0,
               stages: tuple[str, ...] | None = None) -> RequestRecord:
        """Build the record and publish it once; later calls return the same record.

        `stages` replaces the tracer's stage order for this record (a proxy record joined
        with its engine's timing, tracer/proxy/engine_join.py).

        `finish_reason` is one of FINISH_REASONS; an unexpected one is not an error here
        (this runs in `finally` blocks) — the metrics fold it into `other`.
        """
        with active._lock:
            if active._record is not None:
                return active._record
            active.timeline.end(end_ns)
            ref = self._in_flight.get(active.request_id)
            if ref is not None and ref() is active:
                self._in_flight.pop(active.request_id, None)
            fields = {
                "request_id": active.request_id, "trace_id": active.trace_id,
                "span_id": active.span_id, "model": active.model,
                "operation": active.operation, "start_ns": active.timeline.start_ns,
                "end_ns": end_ns, "num_prompt_tokens": num_prompt_tokens,
                "num_cached_tokens": num_cached_tokens, "num_output_tokens": num_output_tokens,
                "num_draft_tokens": num_draft_tokens, "num_draft_accepted": num_draft_accepted,
                "finish_reason": finish_reason, "error_type": error_type, "source": self.source,
                "attrs": dict(active.attrs), "span_handle": active._server_span,
                "prompt_source": active.prompt_source, "block_source": active.block_source}
            deferred = False
            if self.enabled:
                # The timing is worked out by the record's first reader, normally the
                # worker (tracer/record/deferred_timing.py); the snapshot is taken now.
                timeline = active.timeline
                record = deferred_record(timeline.snapshot(), stages or self.stages,
                                         timeline.num_dropped_events, fields)
                deferred = self._publish(record)
            else:
                record = DeferredRecord(**fields)
            active._record = record
            if not deferred:
                self._published(1)
        return record

    @property
    def num_active(self) -> int:
        """Requests begun and not yet through every sink (a waiting point for tests and
        drains: at 0, every finished record has reached the metrics, spans and logs)."""
        return self._num_active

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every record finished before this call has reached every sink: the
        read-your-writes barrier of `/metrics` and of tests. True when it did (at once
        without a worker); False on timeout."""
        return True if self.worker is None else self.worker.flush(timeout_s)

    def is_idle(self, timeout_s: float | None = None) -> bool:
        """Drain, then whether no request is active: what a test waits for after its
        requests. Without the drain a finished record could wait out the worker's linger
        (tracer/core/record_worker.py, up to 1 s) while other requests keep starting."""
        return self.drain(timeout_s) and self._num_active == 0

    def close(self, timeout_s: float | None = None) -> bool:
        """Drain, then stop the worker thread (a server's shutdown). A record finished
        afterwards starts it again. True when everything was published in time."""
        return True if self.worker is None else self.worker.close(timeout_s)

    def _published(self, num_records: int) -> None:
        with self._count_lock:
            self._num_active -= num_records

    @property
    def num_sink_errors(self) -> int:
        """How many times any sink (or the span start) raised."""
        return sum(self.sink_failures.values())

    def _publish(self, record: RequestRecord) -> bool:
        """Inline sinks now, the rest handed to the worker; True when the worker took it."""
        # Tracing must never fail a request: a raising sink is counted and logged, and the
        # remaining sinks still run (on the worker too: RecordWorker._publish).
        with self._publish_lock:
            for sink in self._inline_sinks:
                try:
                    sink.publish(record)
                except Exception as exc:
                    self._sink_failed(sink, exc)
            if self.worker is None:
                return False
            self.worker.submit(record)
            return True

    def _sink_failed(self, sink, exc: BaseException) -> None:
        self._count_failure(sink)
        _internal_log.error("ttftscope: the %s sink failed", sink_name(sink),
                            exc_info=(type(exc), exc, exc.__traceback__))

    def _count_failure(self, sink) -> None:
        # Both the finishing thread and the worker count: hence the lock.
        name = sink_name(sink)
        with self._count_lock:
            self.sink_failures[name] = self.sink_failures.get(name, 0) + 1
