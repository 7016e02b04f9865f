"""One perf_counter → epoch mapping per process, so spans and the UI never drift apart."""
from __future__ import annotations

import time


class Clock:
    """Maps `time.perf_counter_ns()` values to epoch ns, anchored once.

    >>> clock = Clock(wall_ns=1_700_000_000_000_000_000, perf_ns=5_000)
    >>> clock.to_epoch_ns(6_000)
    1700000000000001000
    """

    __slots__ = ("wall_ns", "perf_ns", "_offset_ns")

    def __init__(self, wall_ns: int | None = None, perf_ns: int | None = None) -> None:
        # Read perf first, wall second: the two calls are ~100 ns apart, an accepted error.
        self.perf_ns = time.perf_counter_ns() if perf_ns is None else perf_ns
        self.wall_ns = time.time_ns() if wall_ns is None else wall_ns
        self._offset_ns = self.wall_ns - self.perf_ns

    @property
    def offset_ns(self) -> int:
        """What `to_epoch_ns` adds: for a caller converting many times at once."""
        return self._offset_ns

    def to_epoch_ns(self, perf_ns: int) -> int:
        return perf_ns + self._offset_ns

    def to_perf_ns(self, epoch_ns: int) -> int:
        """The inverse of `to_epoch_ns`: a wall-clock time on the perf_counter axis."""
        return epoch_ns - self._offset_ns
