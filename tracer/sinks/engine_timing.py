"""`llm_engine_timing_total{source, outcome}`: how the proxy's records met their engine's
own timing, and `llm_engine_timing_rejected_total{source, reason}`: the timings that could
not fit the interval the proxy observed, never placed and never silent
(tracer/proxy/engine_join.py). Every label is closed (`tracer.engines.timing`,
`tracer.engines.placement.REJECTIONS`): every series exists from the first scrape, and
nothing a request or a span says can add one."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from tracer.engines.placement import REJECTIONS
from tracer.engines.timing import ENGINE_OUTCOMES, ENGINE_SOURCES
from tracer.record.labels import OTHER

# A rejection is of a timing that arrived, so never of the "none" source.
_REJECTING_SOURCES = tuple(s for s in ENGINE_SOURCES if s != "none") + (OTHER,)


class EngineTimingMetrics:
    """
    >>> m = EngineTimingMetrics(CollectorRegistry())
    >>> m.count("vllm", "joined"); m.count("evil\\n", "joined")
    >>> m.registry.get_sample_value("llm_engine_timing_total", {"source": "vllm", "outcome": "joined"})
    1.0
    >>> m.reject("ollama", "exceeds_window"); m.reject("ollama", ""); m.reject("ollama", "evil")
    >>> m.registry.get_sample_value("llm_engine_timing_rejected_total",
    ...                             {"source": "ollama", "reason": "exceeds_window"})
    1.0
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        counter = Counter("llm_engine_timing_total", "Proxy records and engine timing "
                          "signals, by the signal's source and how they met", ("source", "outcome"),
                          registry=registry)
        self._children = {(s, o): counter.labels(s, o)
                          for s in ENGINE_SOURCES + (OTHER,) for o in ENGINE_OUTCOMES}
        rejected = Counter("llm_engine_timing_rejected_total", "Engine timings that could not "
                           "fit the interval observed before the first output, by the "
                           "signal's source and why; never placed on the waterfall",
                           ("source", "reason"), registry=registry)
        self._rejected = {(s, r): rejected.labels(s, r)
                          for s in _REJECTING_SOURCES for r in REJECTIONS}

    def count(self, source: str, outcome: str) -> None:
        child = self._children.get((source, outcome)) or self._children.get((OTHER, outcome))
        if child is not None:
            child.inc()

    def reject(self, source: str, reason: str) -> None:
        """One timing that could not be placed; `reason` "" (it was placed) counts nothing,
        and neither does a reason outside REJECTIONS."""
        child = self._rejected.get((source, reason)) or self._rejected.get((OTHER, reason))
        if child is not None:
            child.inc()
