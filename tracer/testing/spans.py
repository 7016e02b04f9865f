"""An in-memory span exporter for tests that reads its writes.

A server built by `build_observability` emits its spans from the tracer's worker thread
(tracer/core/record_worker.py), a little after `Tracer.finish`. A test that reads the spans
of a request it has just made must wait for that worker, and must not sleep to do so: this
exporter calls the bound tracers' `drain()` before every read.
"""
from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

DRAIN_S = 30.0   # a stuck worker fails the read, never hangs the test run


class DrainingSpanExporter(InMemorySpanExporter):
    """`InMemorySpanExporter` whose `get_finished_spans` first drains the bound tracers.

    >>> from opentelemetry.sdk.trace import TracerProvider
    >>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    >>> from tracer.web.observability import ObservabilitySettings, build_observability
    >>> exporter, provider = DrainingSpanExporter(), TracerProvider()
    >>> provider.add_span_processor(SimpleSpanProcessor(exporter))
    >>> obs = build_observability(ObservabilitySettings(), model_names=("m",),
    ...                           tracer_provider=provider)
    >>> exporter = exporter.bind(obs.tracer)
    >>> active = obs.tracer.begin(request_id="r", model="m", operation="chat",
    ...                           traceparent=None, start_ns=0)
    >>> record = obs.tracer.finish(active, end_ns=1, finish_reason="stop")
    >>> [span.name for span in exporter.get_finished_spans()]
    ['chat m']
    """

    def __init__(self) -> None:
        super().__init__()
        self._tracers: list = []

    def bind(self, tracer) -> DrainingSpanExporter:
        """Drain `tracer` (a `tracer.core.request_tracer.Tracer`) before each read."""
        self._tracers.append(tracer)
        return self

    def get_finished_spans(self):
        for tracer in self._tracers:
            if not tracer.drain(DRAIN_S):
                raise TimeoutError(f"the tracer's worker did not drain in {DRAIN_S} s")
        return super().get_finished_spans()
