"""A stream's content emits in bounded memory: the first send times exactly, every gap after
them as counts in the inter-token-latency buckets (docs/architecture.md, "ITL, TPOT and
duration").

A reasoning model's answer runs to 100,000 tokens. Keeping every gap would grow the timeline
by 8 bytes an event while the stream lives, and the trace store by as much afterwards. What
the readers need is bounded:
* the ITL histogram (`tracer/sinks/metrics.py`): per-bucket counts and the exact sum, so the
  metrics come out as if every gap had been observed (tests/tracer/test_emits.py checks it
  against prometheus_client);
* TPOT: the sum and the count; the largest-gap histogram: the max;
* the in-band line and the buffering check: the first `MAX_SEND_TIMES` send times.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from tracer.record.buckets import ITL_BUCKETS_S

# Send times kept exactly: the in-band line's `send` list (tracer/web/inband.py) and the
# probe's chunk arrivals (schema.MAX_CHUNK_TIMES) are bounded by the same number, so nothing
# past it has a reader.
MAX_SEND_TIMES = 32


@dataclass(slots=True, frozen=True)
class GapSummary:
    """The gaps between consecutive emits of one stream.

    `bucket_counts[i]` counts the gaps g with ITL_BUCKETS_S[i-1] < g·1e-9 <= ITL_BUCKETS_S[i]
    (the last entry: above every edge), which is how a Prometheus histogram places them.

    >>> log = EmitLog(); [log.add(t) for t in (0, 2_000_000, 5_000_000)] and None
    >>> s = log.summary(); (s.count, s.sum_ns, s.max_ns, s.mean_ns, s.first_ns)
    (2, 5000000, 3000000, 2500000, (2000000, 3000000))
    """

    count: int = 0
    sum_ns: int = 0
    min_ns: int | None = None
    max_ns: int | None = None
    bucket_counts: tuple[int, ...] = ()
    first_ns: tuple[int, ...] = ()     # the first MAX_SEND_TIMES - 1 gaps, in order

    @property
    def mean_ns(self) -> int | None:
        """(last emit − first emit) / (n − 1): TPOT as docs/architecture.md defines it."""
        return self.sum_ns // self.count if self.count else None

    @classmethod
    def of(cls, gaps_ns: tuple[int, ...] | list[int]) -> GapSummary:
        """The summary of known gaps (tests and records built by hand).

        >>> GapSummary.of((1_000, 3_000)).mean_ns
        2000
        """
        log, t_ns = EmitLog(), 0
        log.add(t_ns)
        for gap_ns in gaps_ns:
            t_ns += gap_ns
            log.add(t_ns)
        return log.summary()


NO_GAPS = GapSummary()


class EmitLog:
    """The writer's side, inside a `Timeline`: `add(t_ns)` per content chunk handed to the
    transport. Emits of one request come from one thread (the one writing the response), so
    the few stores of `add` need no lock; `summary()` is read after the last emit, or on that
    same thread (the in-band line).

    >>> log = EmitLog()
    >>> for t in range(0, 100 * 1_000_000, 1_000_000): log.add(t)
    >>> log.count, len(log.first_ns), log.summary().bucket_counts[0]
    (100, 32, 99)
    """

    __slots__ = ("first_ns", "count", "last_ns", "sum_gap_ns", "min_gap_ns", "max_gap_ns",
                 "_buckets")

    def __init__(self) -> None:
        self.first_ns: list[int] = []
        self.count = 0
        self.last_ns = 0
        self.sum_gap_ns = 0
        self.min_gap_ns: int | None = None
        self.max_gap_ns: int | None = None
        self._buckets: list[int] | None = None   # made at the second emit

    def add(self, t_ns: int) -> None:
        count = self.count
        if count:
            gap_ns = t_ns - self.last_ns
            buckets = self._buckets
            if buckets is None:
                buckets = self._buckets = [0] * (len(ITL_BUCKETS_S) + 1)
                self.min_gap_ns = self.max_gap_ns = gap_ns
            elif gap_ns > self.max_gap_ns:
                self.max_gap_ns = gap_ns
            elif gap_ns < self.min_gap_ns:
                self.min_gap_ns = gap_ns
            # The same float comparison `Histogram.observe(gap_ns * 1e-9)` makes.
            buckets[bisect_left(ITL_BUCKETS_S, gap_ns * 1e-9)] += 1
            self.sum_gap_ns += gap_ns
        if count < MAX_SEND_TIMES:
            self.first_ns.append(t_ns)
        self.count = count + 1
        self.last_ns = t_ns

    def summary(self) -> GapSummary:
        if self._buckets is None:
            return NO_GAPS
        first = self.first_ns
        return GapSummary(self.count - 1, self.sum_gap_ns, self.min_gap_ns, self.max_gap_ns,
                          tuple(self._buckets),
                          tuple(b - a for a, b in zip(first, first[1:])))
