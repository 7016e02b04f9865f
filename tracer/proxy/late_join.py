"""Engine spans that come after their record was published: the trace store's copy is
updated, nothing else.

A record is published without its engine's span when it waited its time (`timeout`) or had
nothing to wait for (`no_signal`: no engine span had arrived yet, so the first requests
after the proxy starts never wait). Its span can still come: an exporter's batch was late,
or the engine had not exported anything before. The join key stays the secret parent id
(docs/receiver-threat-model.md, "What a span can change"): the last `max_remembered` such
records are remembered by (trace id, upstream parent id) → request id, and a span under one
of them changes the store's copy of that record (`TraceStore.replace`) once: the engine's
stages inside the upstream window (`placed_spans`), its `llm.engine.*` attributes with
`llm.engine.outcome = late`, and the token counts the stream did not report. The record the
metrics, spans and log line saw is not touched, so nothing is observed twice and no counter
goes back; `/ui` and the trace export read the store, and show the engine's stages.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

from tracer.engines.placement import Placement, engine_attrs, place, placed_spans
from tracer.engines.timing import EngineTiming
from tracer.record.request_record import RequestRecord
from tracer.sinks.spans import UPSTREAM_SPAN_ID
from tracer.sinks.store import TraceStore


class LateJoins:
    """(trace id, upstream parent id) → request id of the last `max_remembered` records
    published without their engine's timing."""

    def __init__(self, store: TraceStore, max_remembered: int, *,
                 to_perf_ns: Callable[[int], int], max_skew_ns: int) -> None:
        self._store = store
        self._max = max_remembered
        self._to_perf_ns = to_perf_ns
        self._max_skew_ns = max_skew_ns
        self._waiting: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()

    def remember(self, key: tuple[str, str], request_id: str) -> None:
        self._waiting[key] = request_id
        if len(self._waiting) > self._max:
            self._waiting.popitem(last=False)

    def join(self, key: tuple[str, str], timing: EngineTiming) -> Placement | None:
        """How `timing` was placed in the store's copy of the record named by `key` (a
        timing that cannot fit changes no stage: the copy then carries the reason); None when
        no such record was published without one, or it has left the store since."""
        request_id = self._waiting.pop(key, None)
        if request_id is None:
            return None
        changed: list[Placement] = []

        def late(old: RequestRecord) -> RequestRecord:
            # A request id can be reused (a client's `X-Request-Id`): only the record that
            # was sent this secret parent takes the span.
            if old.trace_id != key[0] or old.attrs.get(UPSTREAM_SPAN_ID) != key[1]:
                return old
            new, placement = self._late(old, timing)
            changed.append(placement)
            return new
        self._store.replace(request_id, late)
        return changed[0] if changed else None

    def __len__(self) -> int:
        return len(self._waiting)

    def _late(self, record: RequestRecord,
              timing: EngineTiming) -> tuple[RequestRecord, Placement]:
        ends = {s.stage: s.end_ns for s in record.stages}
        placement = place(timing, window_start_ns=ends.get("upstream_connect"),
                          window_end_ns=ends.get("upstream_first_token"),
                          to_perf_ns=self._to_perf_ns, max_skew_ns=self._max_skew_ns)
        attrs = {**record.attrs, **engine_attrs(timing, placement, outcome="late")}
        stages = placed_spans(record.stages, placement) or record.stages
        return dataclasses.replace(
            record, stages=stages, attrs=attrs,
            num_prompt_tokens=record.num_prompt_tokens or timing.num_prompt_tokens or 0,
            num_cached_tokens=record.num_cached_tokens or timing.num_cached_tokens or 0), \
            placement
