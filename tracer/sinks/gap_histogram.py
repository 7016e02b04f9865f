"""A stream's inter-token gaps into a Prometheus histogram: from their bucket counts
(`add_gap_summary`), or one by one as a probe beacon reports them (`observe_gaps`).

`tracer.record.emits` keeps the gaps of a stream as counts in the ITL buckets, not one by one
(memory bounded by the bucket ladder, not by the answer's length). `Histogram.observe` takes
one value; prometheus_client has no public call that adds a count to a bucket, so this adds
to the child's bucket and sum values directly: one `inc` per non-empty bucket instead of one
`observe` per gap. tests/tracer/test_emits.py checks, against `observe` on every gap, that
the exposition is the same (counts exactly, the sum to float rounding), on the version the
lock pins. `observe_with` is `observe` by the same internals, for a finished record's other
observations (tests/tracer/test_metrics.py compares the writes).
"""
from __future__ import annotations

import time
from bisect import bisect_left
from typing import Sequence

from prometheus_client.samples import Exemplar

from tracer.record.emits import GapSummary


def add_gap_summary(child, gaps: GapSummary, exemplar: dict | None) -> None:
    """Add `gaps` to a labelled `Histogram` child built with `ITL_BUCKETS_S`. Only the
    largest gap carries the exemplar: it is the one worth a click-through."""
    buckets = child._buckets
    if len(buckets) != len(gaps.bucket_counts):
        raise ValueError(f"the histogram has {len(buckets)} buckets, the gaps "
                         f"{len(gaps.bucket_counts)}: it must be built with ITL_BUCKETS_S")
    child._raise_if_not_observable()
    child._sum.inc(gaps.sum_ns * 1e-9)
    for bucket, count in zip(buckets, gaps.bucket_counts):
        if count:
            bucket.inc(count)
    if exemplar and gaps.max_ns is not None:
        worst_s = gaps.max_ns * 1e-9
        at = next(i for i, bound in enumerate(child._upper_bounds) if worst_s <= bound)
        buckets[at].set_exemplar(Exemplar(exemplar, worst_s, time.time()))


def observe_gaps(child, gaps_s: Sequence[float], exemplar: dict | None) -> None:
    # Only the worst gap carries the exemplar: it is the one worth a click-through, and an
    # exemplar on each would cost ~1.5 µs more per gap.
    if not gaps_s:
        return
    observe = child.observe
    worst = max(gaps_s)
    i = gaps_s.index(worst)
    for gap in gaps_s[:i]:
        observe(gap)
    for gap in gaps_s[i + 1:]:
        observe(gap)
    observe(worst, exemplar)


def observe_with(child, amount: float, exemplar: dict | None, now: float) -> None:
    """`child.observe(amount, exemplar)` for a bound `Histogram` child, with the exemplar
    stamped `now`: the same sum, bucket and exemplar writes (the bucket found by bisection:
    the first upper bound >= amount, as `observe`'s scan finds it). `exemplar` must come
    from `tracer.sinks.metrics.exemplar_for` (valid label names, within the 128-character limit), which is why
    it is not validated again here. A NaN goes through `observe` itself.

    >>> from prometheus_client import CollectorRegistry, Histogram
    >>> h = Histogram("h", "h", ("m",), registry=CollectorRegistry(), buckets=(1.0, 2.0))
    >>> child = h.labels("x"); observe_with(child, 1.5, {"trace_id": "ab"}, 7.0)
    >>> [b.get() for b in child._buckets], child._buckets[1].get_exemplar()
    ([0.0, 1.0, 0.0], Exemplar(labels={'trace_id': 'ab'}, value=1.5, timestamp=7.0))
    """
    if amount != amount:
        child.observe(amount, exemplar)
        return
    child._sum.inc(amount)
    bucket = child._buckets[bisect_left(child._upper_bounds, amount)]
    bucket.inc(1)
    if exemplar:
        bucket.set_exemplar(Exemplar(exemplar, amount, now))


class WriteNow:
    """`ObservationBatch`'s two writes done at once (tracer/sinks/observation_batch.py):
    what a record's observations go through when no batch holds them."""

    __slots__ = ()
    observe = staticmethod(observe_with)

    @staticmethod
    def inc(value, amount: float) -> None:
        """`value.inc(amount)` on a child's own value (`child._value`), for counts the record
        already checked (>= 0)."""
        value.inc(amount)


WRITE_NOW = WriteNow()
