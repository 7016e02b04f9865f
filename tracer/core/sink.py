"""The one shape every consumer of a finished request has: `publish(record)`.

The store, the Prometheus metrics, the span exporter and the log line are each a
`RecordSink`; the `Tracer` fans a record out to a list of them and counts each one's
failures by `sink_name`. A new consumer (a file, a queue, another backend) is one class with
one method, added to the list in `tracer.web.observability.build_observability`.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from tracer.record.request_record import RequestRecord


@runtime_checkable
class RecordSink(Protocol):
    def publish(self, record: RequestRecord) -> None:
        """Consume one finished record. Runs after the response, on the finishing thread;
        raising is allowed (it is counted, and the other sinks still run)."""


def sink_name(sink: object) -> str:
    """A sink's name in failure counts: its `name` attribute, else its class name.

    >>> class Store:
    ...     def publish(self, record): pass
    >>> sink_name(Store())
    'Store'
    """
    return getattr(sink, "name", None) or type(sink).__name__
