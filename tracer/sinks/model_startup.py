"""How long the serving process took to get ready: model load and warm-up, as gauges.

Read at scrape time from whatever holds the numbers (the engine), through a callable, so
this module knows nothing about the engine. A value not known (yet, or ever: a warm-up that
was skipped or failed, a model loaded by a caller that did not time it) exports no series,
never a zero (docs/reference.md, "Metrics").
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

# (name, help), in the order `read` returns their values; labelled by the served model.
STARTUP_METRICS = (
    ("llm_model_load_seconds", "Time to load the model's weights onto the device"),
    ("llm_model_warmup_seconds", "Time of the warm-up run before /health said ready"),
)


class ModelStartupCollector:
    """Gauges of `read()` = (load seconds, warm-up seconds), None for unknown.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> times = {"load": 2.5, "warmup": None}
    >>> registry = CollectorRegistry()
    >>> _ = ModelStartupCollector(registry, "smollm2", lambda: (times["load"], times["warmup"]))
    >>> [line for line in generate_latest(registry).decode().splitlines() if line[0] != "#"]
    ['llm_model_load_seconds{model="smollm2"} 2.5']
    """

    def __init__(self, registry: CollectorRegistry | None, model: str,
                 read: Callable[[], tuple[float | None, float | None]]) -> None:
        self._model = model   # a served model name, never a request's string
        self._read = read
        if registry is not None:
            registry.register(self)

    def describe(self) -> list:
        # Empty: the families come and go with the values (a warm-up finishes later).
        return []

    def collect(self):
        for (name, doc), value in zip(STARTUP_METRICS, self._read()):
            if value is not None:
                family = GaugeMetricFamily(name, doc, labels=["model"])
                family.add_metric([self._model], float(value))
                yield family
