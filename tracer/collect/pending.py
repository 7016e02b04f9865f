"""Traces waiting for their parts: the browser's beacon, the backend's spans, the engine's.

The parts of one trace come from different processes at different times: the engine's
and the backend's batch span processors export every few seconds, the beacon leaves when
the stream ends. Each trace waits here until it is complete (the beacon, the backend's root
span under the browser's span, and an engine's timing: its request span or the beacon's
signed in-band timing) or until `wait_s` after its first part, whichever is first, and is
then handed to `on_ready` once. Bounded in time (`wait_s`), in traces (`max_traces`: the
oldest leaves early, counted `evicted`) and in spans per trace (`max_spans_per_trace`, the
rest counted `over_limit`). A part that arrives after its trace left is counted `late` (the
last `max_traces` trace ids that left are remembered) and changes nothing: the record was
published, its metrics observed.

Runs on the collector's event loop only (the receivers hand their spans over there).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tracer.collect.trust import SERVER
from tracer.collect.whole_path import browser_span_id
from tracer.engines.detect import is_request_span
from tracer.engines.spans import SpanView
from tracer.sinks.path_metrics import PathMetrics
from tracer.web.probe.beacon import Beacon

# The engines' and backends' batch span processors export every 5 s by default
# (OTEL_BSP_SCHEDULE_DELAY), plus the POST: the same wait as the proxy's engine join.
DEFAULT_WAIT_S = 8.0
DEFAULT_MAX_TRACES = 10_000
DEFAULT_MAX_SPANS_PER_TRACE = 512


@dataclass(slots=True)
class PendingTrace:
    first_seen_ns: int
    spans: list[SpanView] = field(default_factory=list)
    beacon: Beacon | None = None
    server: object = None              # the beacon's checked InbandTiming, if it had one
    client_observed: bool = False      # the in-band join already observed the client metrics
    has_engine: bool = False
    server_parents: set[str] = field(default_factory=set)   # parents of its SERVER spans

    def complete(self, trace_id: str) -> bool:
        if self.beacon is None or not (self.has_engine or self.server is not None):
            return False
        # Without the browser's span id the root is found from the engine span: wait for
        # the deadline, when every backend span has had its export.
        return browser_span_id(self.beacon, trace_id) in self.server_parents


class PendingTraces:
    def __init__(self, on_ready: Callable[[str, PendingTrace, bool], None], metrics: PathMetrics,
                 *, wait_s: float = DEFAULT_WAIT_S, max_traces: int = DEFAULT_MAX_TRACES,
                 max_spans_per_trace: int = DEFAULT_MAX_SPANS_PER_TRACE,
                 clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._on_ready = on_ready   # (trace id, its parts, evicted)
        self._metrics = metrics
        self.wait_ns = round(wait_s * 1e9)
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self._clock_ns = clock_ns
        self._pending: OrderedDict[str, PendingTrace] = OrderedDict()   # first seen first
        self._left: OrderedDict[str, None] = OrderedDict()
        # Whether any span has come: until then nobody exports to this collector, and a
        # beacon already joined from its in-band timing has nothing to wait for.
        self.receiving_spans = False

    def __len__(self) -> int:
        return len(self._pending)

    def add_spans(self, spans: Iterable[SpanView]) -> None:
        self.receiving_spans = True
        by_trace: dict[str, list[SpanView]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        for trace_id, group in by_trace.items():
            if trace_id in self._left:
                self._metrics.count_spans("late", len(group))
                continue
            trace = self._trace(trace_id)
            room = self.max_spans_per_trace - len(trace.spans)
            kept = group[:max(room, 0)]
            self._metrics.count_spans("over_limit", len(group) - len(kept))
            self._metrics.count_spans("accepted", len(kept))
            trace.spans.extend(kept)
            trace.server_parents.update(s.parent_span_id for s in kept if s.kind == SERVER)
            trace.has_engine = trace.has_engine or any(map(is_request_span, kept))
            self._maybe_ready(trace_id, trace)

    def add_beacon(self, trace_id: str, beacon: Beacon, server=None, *,
                   client_observed: bool = False) -> bool:
        """False when the trace already had its beacon, or left: the first beacon wins."""
        if trace_id in self._left:
            return False
        trace = self._trace(trace_id)
        if trace.beacon is not None:
            return False
        trace.beacon, trace.server, trace.client_observed = beacon, server, client_observed
        self._maybe_ready(trace_id, trace)
        return True

    def expire(self) -> int:
        """Hand over every trace whose wait is over; how many left."""
        deadline = self._clock_ns() - self.wait_ns
        n = 0
        while self._pending:
            trace_id, trace = next(iter(self._pending.items()))
            if trace.first_seen_ns > deadline:
                break
            self._leave(trace_id, evicted=False)
            n += 1
        return n

    def _trace(self, trace_id: str) -> PendingTrace:
        trace = self._pending.get(trace_id)
        if trace is None:
            if len(self._pending) >= self.max_traces:
                self._leave(next(iter(self._pending)), evicted=True)
            trace = self._pending[trace_id] = PendingTrace(self._clock_ns())
            self._metrics.pending.set(len(self._pending))
        return trace

    def _maybe_ready(self, trace_id: str, trace: PendingTrace) -> None:
        if trace.complete(trace_id):
            self._leave(trace_id, evicted=False)

    def _leave(self, trace_id: str, *, evicted: bool) -> None:
        trace = self._pending.pop(trace_id)
        self._left[trace_id] = None
        if len(self._left) > self.max_traces:
            self._left.popitem(last=False)
        self._metrics.pending.set(len(self._pending))
        self._on_ready(trace_id, trace, evicted)
