"""Record sinks for tests: one that keeps what it is given, one that always raises.

Public, like `structlog.testing`: a user's own tests can plug them into a `Tracer`.
"""
from __future__ import annotations

from tracer.record.request_record import RequestRecord


class CapturingSink:
    """Keeps every published record, in order.

    >>> sink = CapturingSink()
    >>> sink.publish("a record"); sink.records
    ['a record']
    """

    name = "capturing"

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def publish(self, record: RequestRecord) -> None:
        self.records.append(record)


class RaisingSink:
    """Raises on every record: for asserting that one broken sink costs the others nothing."""

    name = "raising"

    def __init__(self, exc: Exception | None = None) -> None:
        self.exc = exc or RuntimeError("sink failed")
        self.calls = 0

    def publish(self, record: RequestRecord) -> None:
        self.calls += 1
        raise self.exc
