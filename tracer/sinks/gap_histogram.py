"""A stream's inter-token gaps into a Prometheus histogram: from their bucket counts
(`add_gap_summary`), or one by one as a probe beacon reports them (`observe_gaps`).

`tracer.record.emits` keeps the gaps of a stream as counts in the ITL buckets, not one by one
(memory bounded by the bucket ladder, not by the answer's length). `Histogram.observe` takes
one value; prometheus_client has no public call that adds a count to a bucket, so this adds
to the child's bucket and sum values directly: one `inc` per non-empty bucket instead of one
`observe` per gap. tests/tracer/test_emits.py checks, against `observe` on every gap, that
the exposition is the same (counts exactly, the sum to float rounding), on the version the
lock pins.
"""
from __future__ import annotations

import time
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
