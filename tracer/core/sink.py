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
    """`publish(record)`, plus two optional class attributes: `name` (in failure counts)
    and `inline`. A tracer built with `background=True` publishes to the sinks with
    `inline = True` inside `finish`, on the finishing thread, and to all others from its
    worker thread; an inline sink must be cheap (a few µs) and is for what readers need the
    instant the response ends (the trace store: the probe join and `/ui`)."""

    def publish(self, record: RequestRecord) -> None:
        """Consume one finished record. Runs after the response, on the finishing thread
        or the tracer's worker thread, never on both at once; raising is allowed (it is
        counted, and the other sinks still run). The record is complete: treat it as
        read-only (only the store's probe join writes `record.client` later)."""


class BatchSink(Protocol):
    """A sink that gains from seeing a batch: the worker (tracer/core/record_worker.py) hands
    it each record of a batch with `collect(record)` and ends the batch with `flush_batch()`,
    before the batch counts as published (so `flush`, the scrape's read-your-writes, still
    sees every write). What `collect` holds back is written by `flush_batch`: the metrics
    (`LLMMetrics`) group a batch's observations by histogram child, one locked write per
    bucket instead of three per observation. `publish(record)` must leave what
    `collect(record)` then `flush_batch()` leaves."""

    def publish(self, record: RequestRecord) -> None: ...

    def collect(self, record: RequestRecord) -> None: ...

    def flush_batch(self) -> None: ...


def batch_methods(sink: object):
    """`(collect, flush_batch)` of a `BatchSink`, else `(publish, None)`: what the worker
    calls for each record, and once at the end of a batch.

    >>> class Plain:
    ...     def publish(self, record): pass
    >>> batch_methods(Plain())[1] is None
    True
    """
    collect, flush = getattr(sink, "collect", None), getattr(sink, "flush_batch", None)
    if callable(collect) and callable(flush):
        return collect, flush
    return sink.publish, None


def is_inline(sink: object) -> bool:
    """Whether `sink` asks to run on the finishing thread (`inline = True`).

    >>> class Index:
    ...     inline = True
    ...     def publish(self, record): pass
    >>> is_inline(Index()), is_inline(object())
    (True, False)
    """
    return getattr(sink, "inline", False) is True


def sink_name(sink: object) -> str:
    """A sink's name in failure counts: its `name` attribute, else its class name.

    >>> class Store:
    ...     def publish(self, record): pass
    >>> sink_name(Store())
    'Store'
    """
    return getattr(sink, "name", None) or type(sink).__name__
