"""`llm_engine_timing_total{source, outcome}`: how the proxy's records met their engine's
own timing (tracer/proxy/engine_join.py). Both labels are closed
(`tracer.engines.timing`): every series exists from the first scrape, and nothing a
request or a span says can add one."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from tracer.engines.timing import ENGINE_OUTCOMES, ENGINE_SOURCES
from tracer.record.labels import OTHER


class EngineTimingMetrics:
    """
    >>> m = EngineTimingMetrics(CollectorRegistry())
    >>> m.count("vllm", "joined"); m.count("evil\\n", "joined")
    >>> m.registry.get_sample_value("llm_engine_timing_total", {"source": "vllm", "outcome": "joined"})
    1.0
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        counter = Counter("llm_engine_timing_total", "Proxy records and engine timing "
                          "signals, by the signal's source and how they met", ("source", "outcome"),
                          registry=registry)
        self._children = {(s, o): counter.labels(s, o)
                          for s in ENGINE_SOURCES + (OTHER,) for o in ENGINE_OUTCOMES}

    def count(self, source: str, outcome: str) -> None:
        child = self._children.get((source, outcome)) or self._children.get((OTHER, outcome))
        if child is not None:
            child.inc()
