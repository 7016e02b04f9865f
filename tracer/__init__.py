"""ttftscope's tracer: where did the time before the first token go?

The public API. The record vocabulary and the `Tracer` facade are standard library only and
imported eagerly; the composition root (`build_observability`, which pulls in FastAPI,
Prometheus and OpenTelemetry) is imported on first use, so `import tracer` stays cheap.
docs/architecture.md explains the layers.

>>> import tracer
>>> tracer.SERVER_STAGES[0], tracer.SERVER_STAGES[-1]
('receive', 'send')
>>> tracer.build_observability.__module__
'tracer.web.observability'
"""
from __future__ import annotations

import importlib

from tracer.core.request_tracer import ActiveRequest, Tracer
from tracer.core.sink import RecordSink
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import CLIENT_STAGES, PROXY_STAGES, SERVER_STAGES, UNATTRIBUTED

# Name → module, resolved on first attribute access (PEP 562).
_LAZY = {
    "build_observability": "tracer.web.observability",
    "Observability": "tracer.web.observability",
    "ObservabilitySettings": "tracer.web.observability",
}

__all__ = ["ActiveRequest", "CLIENT_STAGES", "PROXY_STAGES", "RecordSink", "RequestRecord",
           "SERVER_STAGES", "StageSpan", "Tracer", "UNATTRIBUTED", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
