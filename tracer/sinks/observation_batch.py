"""A batch of records' histogram and counter writes, grouped, then written at once.

Each observation of a finished record is three locked writes on prometheus_client's values
(the sum, the bucket, the bucket's exemplar) and an `Exemplar` tuple; a record makes about
sixteen, and a batch of the tracer's worker (tracer/core/record_worker.py) makes them for up
to 64 records that mostly fall in the same few buckets of the same children. `observe` and
`inc` here only add to this batch's own tallies; `apply` then writes each child's sum once,
each bucket's count once and each bucket's exemplar once: the last observation that fell in
it, as writing them one by one would have left it. The exposition after `apply` is the one
the same writes one by one give: bucket counts and exemplars exactly, a sum to float rounding
(added in another order). tests/tracer/test_observation_batch.py checks that against
`Histogram.observe` over random observations, on the version the lock pins.

A batch belongs to one thread (the worker's, or a caller's own for one record); `apply` is
safe beside a scrape and beside other writers (each write takes the value's own lock).
"""
from __future__ import annotations

from bisect import bisect_left

from prometheus_client.samples import Exemplar


class ObservationBatch:
    """Histogram observations and counter increments held until `apply`.

    >>> from prometheus_client import CollectorRegistry, Histogram
    >>> h = Histogram("h", "h", ("m",), registry=CollectorRegistry(), buckets=(1.0, 2.0))
    >>> child, batch = h.labels("x"), ObservationBatch()
    >>> batch.observe(child, 1.5, {"trace_id": "ab"}, 7.0)
    >>> batch.observe(child, 1.7, {"trace_id": "cd"}, 8.0)
    >>> [b.get() for b in child._buckets]
    [0.0, 0.0, 0.0]
    >>> batch.apply(); [b.get() for b in child._buckets], child._buckets[1].get_exemplar()
    ([0.0, 2.0, 0.0], Exemplar(labels={'trace_id': 'cd'}, value=1.7, timestamp=8.0))
    """

    __slots__ = ("_histograms", "_counters", "_direct")

    def __init__(self) -> None:
        # child -> [sum, {bucket index: count}, {bucket index: (labels, value, timestamp)}]
        self._histograms: dict = {}
        self._counters: dict = {}    # a child's value (`child._value`) -> amount
        self._direct: list = []      # (child, amount, exemplar): NaN, left to `observe`

    def observe(self, child, amount: float, exemplar: dict | None, now: float) -> None:
        """`tracer.sinks.gap_histogram.observe_with(child, amount, exemplar, now)`, held.
        `exemplar` comes from `tracer.sinks.metrics.exemplar_for` (already valid)."""
        if amount != amount:
            self._direct.append((child, amount, exemplar))
            return
        entry = self._histograms.get(child)
        if entry is None:
            entry = self._histograms[child] = [0.0, {}, {}]
        entry[0] += amount
        at = bisect_left(child._upper_bounds, amount)   # the first bound >= amount
        counts = entry[1]
        counts[at] = counts.get(at, 0) + 1
        if exemplar:
            entry[2][at] = (exemplar, amount, now)

    def inc(self, value, amount: float) -> None:
        """`value.inc(amount)` on a child's own value (`child._value`), held: for counts the
        record already checked (>= 0), as `LLMMetrics.observe_request` writes them."""
        self._counters[value] = self._counters.get(value, 0) + amount

    def apply(self) -> None:
        """Write what the batch holds, then hold nothing."""
        histograms, counters, direct = self._histograms, self._counters, self._direct
        self._histograms, self._counters, self._direct = {}, {}, []
        for child, (total, counts, exemplars) in histograms.items():
            child._sum.inc(total)
            buckets = child._buckets
            for at, count in counts.items():
                buckets[at].inc(count)
            for at, (labels, value, timestamp) in exemplars.items():
                buckets[at].set_exemplar(Exemplar(labels, value, timestamp))
        for value, amount in counters.items():
            value.inc(amount)
        for child, amount, exemplar in direct:
            child.observe(amount, exemplar)
