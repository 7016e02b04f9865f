"""The join of a proxy record with its engine's own timing, and the pending table.

The upstream is sent a `traceparent` of the request's trace and sampling flags whose
parent id is fresh, a secret id (tracer/record/ids.py), and seen by nobody but the upstream: the client sees
the proxy's own span id (`Server-Timing`, the beacon and in-band tokens), never this one. An
engine that traces makes its request span a child of that id, so a received span matches
the record whose (trace id, upstream parent id) equals its (trace id, parent span id), and
nothing a client can see is enough to forge it (docs/receiver-threat-model.md, "What a span
can change"). Spans arrive after the stream has ended (the engines' batch exporters wait up
to 5 s), so a finished record waits here, bounded in count (`max_pending`) and time
(`wait_s`), and is published once: with the engine's stages when its span came, as before
(the proxy's five stages, `llm.engine.outcome = timeout`) when it did not. In-band signals
(llama.cpp's `timings`, TGI's headers) are known when the response ends and join at once.

A span that matches no record changes nothing (`unmatched_span`). A second span for one
request is never preferred silently: the same span again (an exporter's retry) is
`duplicate_span`; a different one is `conflict_span`, and a record still held then trusts
neither (`llm.engine.outcome = conflict`, `llm.engine.conflict = true`, the proxy's own
stages). Spans of one export are all matched before any record is published, so two in one
export always reach the record; after publication, the last `max_pending` joined requests
are remembered to tell a conflict or a duplicate from an unmatched span. A span for one of
the last `max_pending` records published without one (`timeout`, `no_signal`) is `late`: it
updates the trace store's copy only (tracer/proxy/late_join.py).

All table operations run on the proxy's event loop: the receivers read the spans elsewhere
and hand the engine timings they found to `on_timings` there.
"""
from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tracer.core.request_tracer import ActiveRequest, Tracer
from tracer.engines.detect import engine_timings
from tracer.engines.placement import engine_attrs, place
from tracer.engines.spans import SpanView
from tracer.engines.timing import EngineTiming
from tracer.proxy.late_join import LateJoins
from tracer.record.ids import new_secret_span_id
from tracer.sinks.engine_timing import EngineTimingMetrics
from tracer.sinks.spans import UPSTREAM_SPAN_ID
from tracer.sinks.store import TraceStore

# The engines' batch span processors export every 5 s by default (OTEL_BSP_SCHEDULE_DELAY):
# a span can come up to ~5 s after its request ended, plus the POST.
DEFAULT_WAIT_S = 8.0
DEFAULT_MAX_PENDING = 10_000
# A sidecar shares the engine's clock (skew ~0); NTP keeps two hosts within a few ms.
DEFAULT_MAX_SKEW_S = 0.005
# How often the wall-clock ↔ perf_counter offset is measured again (NTP slews the wall
# clock; perf_counter does not follow).
_OFFSET_REFRESH_NS = 10 * 10**9


@dataclass(slots=True)
class JoinSettings:
    """What the proxy's CLI flags configure (`--engine-join-wait-s` and friends)."""

    wait_s: float = DEFAULT_WAIT_S
    max_pending: int = DEFAULT_MAX_PENDING
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    # False: records wait only once an engine span has arrived (an engine that exports
    # nothing costs no wait). True: from the first request (the engine is known to export).
    spans_expected: bool = False

    def __post_init__(self) -> None:
        if not self.wait_s > 0 or self.max_pending < 1 or self.max_skew_s < 0:
            raise ValueError("engine join: wait_s > 0, max_pending >= 1 and max_skew_s >= 0")


class _Slot:
    __slots__ = ("active", "timing", "span_id", "conflict", "finish_kwargs", "timer")

    def __init__(self, active: ActiveRequest) -> None:
        self.active = active
        self.timing: EngineTiming | None = None
        self.span_id = ""        # the span that brought `timing`
        self.conflict = False    # a second, different span claimed this request
        self.finish_kwargs: dict | None = None   # set once the response has ended
        self.timer: asyncio.TimerHandle | None = None


class EngineJoin:
    """Holds each proxied request from `expect` to its publication.

    `receiving`: whether spans can arrive at all (the proxy's OTLP receiver is on); without
    it, and before any engine span has arrived (unless `settings.spans_expected`), a record
    with no in-band signal is published at once (`no_signal`). `store`: the trace store
    whose copy a late span updates (None: a late span is `unmatched_span`).
    """

    def __init__(self, tracer: Tracer, metrics: EngineTimingMetrics,
                 settings: JoinSettings = JoinSettings(), *, receiving: bool = True,
                 store: TraceStore | None = None) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.settings = settings
        self.receiving = receiving
        self.spans_seen = settings.spans_expected   # an engine span has arrived
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._pending: collections.OrderedDict[tuple[str, str], _Slot] = collections.OrderedDict()
        # (trace id, upstream parent id) → the span id that matched, for the last
        # `max_pending` matches: a later span for one of them is a duplicate or a conflict.
        self._matched: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()
        self._offset_ns, self._offset_at_ns = epoch_offset_ns(), time.perf_counter_ns()
        self._max_skew_ns = round(settings.max_skew_s * 1e9)
        self._late = None if store is None or not receiving else LateJoins(
            store, settings.max_pending, to_perf_ns=self._to_perf_ns,
            max_skew_ns=self._max_skew_ns)

    # --- the request path (event loop) ----------------------------------------------------

    def expect(self, active: ActiveRequest) -> str:
        """`active` is about to go upstream: returns the `traceparent` to send it, whose
        parent id is a fresh secret its engine's span must name to join."""
        secret = fresh_span_id()
        active.upstream_span_id = secret
        self._slots[(active.trace_id, secret)] = _Slot(active)
        version, trace_id, _own, flags = active.traceparent.split("-")
        return f"{version}-{trace_id}-{secret}-{flags}"

    def finish(self, active: ActiveRequest, *, inband: EngineTiming | None = None,
               **finish_kwargs) -> None:
        """The response has ended: publish now (an in-band signal, a span already here, or
        nothing to wait for), or park the record until its span or its deadline."""
        key = (active.trace_id, active.upstream_span_id)
        slot = self._slots.get(key)
        if slot is None:   # never expected (tracing off), or already published
            self.tracer.finish(active, **finish_kwargs)
            return
        slot.finish_kwargs = finish_kwargs
        timing = inband or slot.timing
        first_token = active.timeline.mark_ns("upstream_first_token") is not None
        if timing is not None:
            self._publish(key, timing)
        elif (not self.receiving or not self.spans_seen or not first_token
              or not self.tracer.enabled):
            self._slots.pop(key, None)
            self.metrics.count("none", "no_signal")
            self._release(active, **finish_kwargs)
            self._may_come_late(key, active)
        else:
            self._park(key, slot)

    def _park(self, key, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        while len(self._pending) >= self.settings.max_pending:
            # Full: the oldest goes out now, as a timeout. Never dropped, never blocking.
            self._expire(next(iter(self._pending)))
        self._pending[key] = slot
        slot.timer = loop.call_later(self.settings.wait_s, self._expire, key)

    # --- spans (event loop) --------------------------------------------------------------

    def on_spans(self, spans: Iterable[SpanView]) -> None:
        """Received spans, read here (tests, in-process callers)."""
        self.on_timings(engine_timings(spans))

    def on_timings(self, found: list[tuple[SpanView, EngineTiming]]) -> None:
        """The engine request spans of one export, with their timings."""
        if found:
            self.spans_seen = True
        came = []   # parked records whose span came: published once the export is read
        for span, timing in found:
            key = (span.trace_id, span.parent_span_id)
            slot = self._slots.get(key)
            if slot is None:
                first = self._matched.get(key)
                late = None
                if first is None and self._late is not None:
                    late = self._late.join(key, timing)
                if late is not None:
                    self._remember(key, span.span_id)
                    self.metrics.count(timing.source, "late")
                    self.metrics.reject(timing.source, late.rejected)
                    continue
                self.metrics.count(timing.source, "unmatched_span" if first is None else
                                   "duplicate_span" if first == span.span_id else "conflict_span")
            elif slot.timing is not None:
                if slot.span_id == span.span_id:
                    self.metrics.count(timing.source, "duplicate_span")
                else:
                    slot.conflict = True
                    self.metrics.count(timing.source, "conflict_span")
            else:
                slot.timing, slot.span_id = timing, span.span_id
                self._remember(key, span.span_id)
                if slot.finish_kwargs is not None:   # parked: its span came
                    came.append(key)
        for key in came:
            self._publish(key, self._slots[key].timing)

    def _remember(self, key, span_id: str) -> None:
        self._matched[key] = span_id
        if len(self._matched) > self.settings.max_pending:
            self._matched.popitem(last=False)

    # --- publication ----------------------------------------------------------------------

    def _publish(self, key, timing: EngineTiming) -> None:
        slot = self._slots.pop(key)
        self._unpark(key, slot)
        active, kwargs = slot.active, dict(slot.finish_kwargs)
        if slot.conflict and timing is slot.timing:
            # Two spans named this request's secret parent: which is the engine's own cannot
            # be told, so neither writes a stage; the record keeps the proxy's own.
            active.attrs.update({"llm.engine.source": timing.source,
                                 "llm.engine.outcome": "conflict", "llm.engine.conflict": True})
            self.metrics.count(timing.source, "conflict")
            self._release(active, **kwargs)
            return
        timeline = active.timeline
        placement = place(timing, window_start_ns=timeline.mark_ns("upstream_connect"),
                          window_end_ns=timeline.mark_ns("upstream_first_token"),
                          to_perf_ns=self._to_perf_ns, max_skew_ns=self._max_skew_ns)
        active.attrs.update(engine_attrs(timing, placement))
        self.metrics.reject(timing.source, placement.rejected)
        stages = None
        if placement.stages:
            start_ns = timeline.mark_ns("upstream_connect")
            for stage, end_ns in zip(placement.stages, placement.ends_ns):
                timeline.mark(stage, end_ns)
                if stage == "prefill" and timing.preempted:
                    # Within its prefill, before its first token: the diagnosis's `preempted`.
                    timeline.event("preempted", start_ns, source=timing.source)
                start_ns = end_ns
            stages = ("receive", "upstream_connect", *placement.stages, "send")
        # The engine's token counts fill what the stream did not say (0: not reported).
        if not kwargs.get("num_prompt_tokens") and timing.num_prompt_tokens:
            kwargs["num_prompt_tokens"] = timing.num_prompt_tokens
        if not kwargs.get("num_cached_tokens") and timing.num_cached_tokens:
            kwargs["num_cached_tokens"] = timing.num_cached_tokens
        self.metrics.count(timing.source, "joined")
        self._release(active, stages=stages, **kwargs)

    def _expire(self, key) -> None:
        slot = self._pending.get(key)
        if slot is None:
            return
        self._slots.pop(key, None)
        self._unpark(key, slot)
        slot.active.attrs["llm.engine.outcome"] = "timeout"
        self.metrics.count("none", "timeout")
        self._release(slot.active, **slot.finish_kwargs)
        self._may_come_late(key, slot.active)

    def _may_come_late(self, key, active: ActiveRequest) -> None:
        # Published without its span: remembered, so a span that still comes reaches /ui.
        if self._late is not None and self.tracer.enabled:
            self._late.remember(key, active.request_id)

    def _release(self, active: ActiveRequest, **finish_kwargs) -> None:
        # Out of the table, the secret joins nothing any more: the record may name it, and
        # its spans then show the upstream call under that id (tracer/sinks/spans.py).
        active.attrs[UPSTREAM_SPAN_ID] = active.upstream_span_id
        self.tracer.finish(active, **finish_kwargs)

    def _unpark(self, key, slot: _Slot) -> None:
        self._pending.pop(key, None)
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None

    def close(self) -> None:
        """Shutdown: every parked record is published now, as a timeout."""
        for key in list(self._pending):
            self._expire(key)

    def _to_perf_ns(self, epoch_ns: int) -> int:
        now = time.perf_counter_ns()
        if now - self._offset_at_ns > _OFFSET_REFRESH_NS:
            self._offset_ns, self._offset_at_ns = epoch_offset_ns(), now
        return epoch_ns - self._offset_ns

    @property
    def num_pending(self) -> int:
        """Finished records waiting for their span."""
        return len(self._pending)

    @property
    def num_expected(self) -> int:
        """Requests in flight or parked (a leak shows here)."""
        return len(self._slots)


def fresh_span_id() -> str:
    """The upstream's parent span id: a secret id (tracer/record/ids.py), not one from the
    Mersenne Twister whose state enough of the span ids a client sees reveal.

    >>> len(fresh_span_id()), fresh_span_id() != fresh_span_id()
    (16, True)
    """
    return new_secret_span_id()


def epoch_offset_ns(samples: int = 5) -> int:
    """wall − perf_counter, in ns, from the tightest of `samples` bracketed readings: one
    reading preempted between its two clock calls (a busy host) would be off by as much as
    the preemption, which the skew check would then blame on the engine.

    >>> abs(epoch_offset_ns() - (time.time_ns() - time.perf_counter_ns())) < 10**8
    True
    """
    best = None
    for _ in range(samples):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    return best[1]
