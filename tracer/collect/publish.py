"""A trace whose parts are in, published once: its whole path as a record for /ui, the
segment metrics, and (unless the in-band join already did) the client metrics and spans.

The record reuses `RequestRecord` on the collector's perf_counter axis (times converted
once from the backend's Unix ns with the collector's `Clock`), so /ui, /ui/api/trace/<id>
and the trace store serve it as they serve the engine's and the proxy's: its `stages` are
the path's segments, named by their spans (attrs: `part`, the metric `label`, the span id
and service, and `worker` for a disaggregated engine's), `ttft_ns` is the backend's root
start → the engine's first token, `client` the beacon's view and `verdict` the path's TTFT
verdict (tracer/collect/path_verdict.py; docs/architecture.md, "The whole path").
"""
from __future__ import annotations

import logging
from collections import defaultdict

from tracer.collect.path_verdict import PathDiagnoser
from tracer.collect.pending import PendingTrace
from tracer.collect.trust import trusted_tree
from tracer.collect.whole_path import WholePath, assemble
from tracer.record.clock import Clock
from tracer.record.labels import model_label
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.segment_names import SegmentNames, segment_name
from tracer.sinks.path_metrics import PathMetrics
from tracer.web.probe.alignment import ClockAlignment, place_client_stages
from tracer.web.probe.ingest import (
    client_view,
    emit_joined_client_spans,
    joined_numbers,
    observe_client_view,
)

_log = logging.getLogger(__name__)


class PathPublisher:
    """`on_ready` of `PendingTraces`."""

    def __init__(self, *, store, metrics, path_metrics: PathMetrics, names: SegmentNames,
                 clock: Clock, model_names: tuple[str, ...], max_skew_ns: int,
                 span_builder=None, diagnoser: PathDiagnoser | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.path_metrics = path_metrics
        self.names = names
        self.clock = clock
        self.model_names = model_names
        self.max_skew_ns = max_skew_ns
        self.span_builder = span_builder
        self.diagnoser = diagnoser

    def __call__(self, trace_id: str, trace: PendingTrace, evicted: bool) -> None:
        pm = self.path_metrics
        beacon = trace.beacon
        if beacon is None:
            pm.count_trace("evicted" if evicted else "no_beacon")
            return
        tree = trusted_tree(trace.spans)
        pm.count_spans("duplicate", tree.duplicates)
        pm.count_spans("forged_parent", tree.forged)
        path = assemble(trace_id, tree, beacon, trace.server, max_skew_ns=self.max_skew_ns)
        if path is None:
            pm.count_trace("evicted" if evicted else "no_path")
            if not trace.client_observed:
                self._observe_client(model_label(beacon.model or "", self.model_names),
                                     beacon, None, trace_id)
            return
        pm.count_trace("evicted" if evicted else
                       "complete" if path.engine_source != "none" else "partial")
        model = model_label(path.model, self.model_names)
        labels = self._labels(path)
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for segment, label in zip(path.segments, labels):
            totals[segment.part, label] += segment.duration_ns
        for (part, label), ns in totals.items():
            pm.observe(model, part, label, ns / 1e9)
        record = self._record(path, model, labels)
        alignment = self._perf_alignment(path.alignment)
        stages = place_client_stages(beacon.t, alignment)
        record.client = client_view(record, beacon, alignment, stages)
        record.client["path_engine_source"] = path.engine_source
        if self.diagnoser is not None:
            self.diagnoser.judge(record)
            if record.verdict is not None:
                self.metrics.observe_verdict(model, record.verdict)
        self.store.put(record)
        if trace.client_observed:
            return
        self._observe_client(model, beacon, record.ttft_ns, trace_id)
        if self.span_builder is not None:
            try:
                emit_joined_client_spans(
                    self.span_builder, trace_id, path.root.span_id, beacon, path.alignment,
                    place_client_stages(beacon.t, path.alignment), None,
                    {"llm.client.join": "collector"}, epoch=True)
            except Exception:   # a span sink must never lose the record
                _log.exception("ttftscope: emitting client spans failed")

    def _labels(self, path: WholePath) -> list[str]:
        """Each segment's metric label; backend names go through the closed vocabulary,
        each name's time in this trace observed once."""
        backend: dict[str, int] = defaultdict(int)
        for segment in path.segments:
            if segment.part == "backend":
                backend[segment_name(segment.name)] += segment.duration_ns
        for name, ns in backend.items():
            self.names.observe(name, ns)
        return [self.names.label(segment_name(s.name)) if s.part == "backend" else s.name
                for s in path.segments]

    def _perf_alignment(self, alignment: ClockAlignment) -> ClockAlignment:
        """Browser ms → this process's perf_counter ns (the record's axis)."""
        return ClockAlignment(self.clock.to_perf_ns(alignment.offset_ns),
                              alignment.uncertainty_ns, alignment.anchor)

    def _record(self, path: WholePath, model: str, labels: list[str]) -> RequestRecord:
        perf = self.clock.to_perf_ns
        root = path.root
        start = perf(root.start_epoch_ns)
        stages = tuple(StageSpan(segment_name(s.name), perf(s.start_ns), perf(s.end_ns),
                                 {"part": s.part, "label": label, "span_id": s.span_id,
                                  "service": s.service, **({"worker": s.worker} if s.worker
                                                           else {})})
                       for s, label in zip(path.segments, labels))
        ttft = (None if path.engine_first_token_ns is None
                else path.engine_first_token_ns - root.start_epoch_ns)
        return RequestRecord(
            # One record per trace: the trace id is its request id (the store's second key).
            request_id=path.trace_id, trace_id=path.trace_id, span_id=root.span_id, model=model,
            operation="chat", start_ns=start, end_ns=max(perf(root.end_epoch_ns), start),
            stages=stages, ttft_ns=ttft, first_output_ns=ttft,
            first_output_kind=None if ttft is None else "text", source="collector",
            attrs={"service.name": root.service, "llm.path.placement": path.placement})

    def _observe_client(self, model: str, beacon, server_ttft_ns: int | None,
                        trace_id: str) -> None:
        view = joined_numbers(beacon, None if server_ttft_ns is None else server_ttft_ns / 1e6)
        observe_client_view(self.metrics, model, view, beacon, trace_id)
