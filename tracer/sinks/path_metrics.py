"""The whole path's metrics, from the collector (docs/reference.md, "Metrics";
docs/architecture.md, "The whole path").

- `llm_path_segment_seconds{model, part, segment}`: each segment of a joined trace's client
  TTFT. `part` is `network`, `backend` or `engine`; a backend `segment` is one of the
  closed `SegmentNames` labels (configured, the learned top N, `other`), an engine one a
  stage name from tracer/record/stages.py or `other`, a network one `network`,
  `backend_to_engine` or `first_token`. The segments of one trace sum to its client TTFT.
- `llm_collector_traces_total{outcome}`: every trace the collector held, once, when it left.
- `llm_collector_spans_total{outcome}`: every span received, once.
- `llm_collector_pending_traces`: traces waiting for their parts.
- `llm_beacon_relay_total{outcome}`: beacons sent on to the collector owning their trace
  (`--beacon-relay-url`), counted by the relay's `OtlpForwarder` under `BEACON_RELAY`.

>>> from prometheus_client import CollectorRegistry
>>> m = PathMetrics(CollectorRegistry(), ("smollm2", "other"))
>>> m.observe("smollm2", "backend", "SELECT docs", 0.025)
>>> m.count_trace("complete"); m.count_spans("accepted", 3)
"""
from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tracer.record.buckets import STAGE_BUCKETS_S
from tracer.record.stages import ENGINE_STAGES, SERVER_STAGES

PARTS = ("network", "backend", "engine")
NETWORK_SEGMENTS = ("network", "backend_to_engine", "first_token")
# What an engine part may be called: the stages our engine and the proxy report, and the
# opaque call when no engine timing came.
ENGINE_SEGMENTS = tuple(dict.fromkeys(SERVER_STAGES + ENGINE_STAGES + ("engine",)))
# complete: beacon, backend root and engine timing; partial: assembled at the deadline
# without the engine's timing; no_path: a beacon, but no root span or first token to
# build on; no_beacon: spans only; evicted: forced out by the pending bound first.
TRACE_OUTCOMES = ("complete", "partial", "no_path", "no_beacon", "evicted")
# accepted: held for its trace; late: its trace had already left; over_limit: past the
# per-trace bound; duplicate: a span id seen before in its trace; forged_parent: an edge no
# service makes (tracer/collect/trust.py). The last two are counted when the trace is built.
SPAN_OUTCOMES = ("accepted", "late", "over_limit", "duplicate", "forged_parent")
OTHER = "other"
# The beacon relay's counter name (without `_total`: prometheus_client adds it).
BEACON_RELAY = "llm_beacon_relay"


class PathMetrics:
    def __init__(self, registry: CollectorRegistry, models: Sequence[str]) -> None:
        self._models = tuple(models)
        self._segment = Histogram(
            "llm_path_segment_seconds", "A segment of client TTFT on the whole path: the "
            "network, the backend's critical path by span name, the engine's stages",
            ("model", "part", "segment"), registry=registry, buckets=STAGE_BUCKETS_S)
        traces = Counter("llm_collector_traces", "Traces the collector held, by outcome when "
                         "they left", ("outcome",), registry=registry)
        spans = Counter("llm_collector_spans", "Spans the collector received, by outcome",
                        ("outcome",), registry=registry)
        self.pending = Gauge("llm_collector_pending_traces", "Traces waiting for their "
                             "beacon, backend spans or engine timing", registry=registry)
        self._traces = {o: traces.labels(o) for o in TRACE_OUTCOMES}
        self._spans = {o: spans.labels(o) for o in SPAN_OUTCOMES}
        for model in self._models:
            for segment in NETWORK_SEGMENTS:
                self._segment.labels(model, "network", segment)
            self._segment.labels(model, "backend", OTHER)

    def observe(self, model: str, part: str, segment: str, seconds: float) -> None:
        """`model` and `segment` are labels already (closed); an unknown part or engine
        segment counts as `other`."""
        if part == "engine" and segment not in ENGINE_SEGMENTS:
            segment = OTHER
        elif part == "network" and segment not in NETWORK_SEGMENTS:
            segment = OTHER
        if part not in PARTS or model not in self._models:
            return
        self._segment.labels(model, part, segment).observe(max(seconds, 0.0))

    def count_trace(self, outcome: str) -> None:
        self._traces[outcome].inc()

    def count_spans(self, outcome: str, n: int = 1) -> None:
        if n:
            self._spans[outcome].inc(n)
