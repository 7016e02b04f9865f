"""Where the neighbours of a request come from: the trace store's finished records, the
tracer's requests in flight and, on our engine, its step record (docs/architecture.md,
"Neighbours").

The diagnosis asks it on the tracer's worker for a queueing or slow-prefill verdict's
culprit; `/ui/api/trace` and `/ui/api/timeline` ask it for a window. Every answer is bounded:
a window's records are found by walking back from the newest until one ended before it,
at most `max_requests` are kept (the newest), and the steps are what the engine's ring
still holds.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from tracer.record.neighbours import Neighbour, neighbours
from tracer.record.occupancy import Occupancy, of_record, of_snapshot
from tracer.record.request_record import RequestRecord
from tracer.record.window_limits import MAX_WINDOW_REQUESTS


class Neighbourhood:
    """Finished and in-flight requests, and the engine's steps, over a window.

    `store` has `overlapping(from_ns, to_ns)` (tracer/sinks/store.py), `tracer` has
    `in_flight()` and `stages`; `attach_steps` gives it the engine's step record.

    >>> from tracer.core.request_tracer import Tracer
    >>> from tracer.sinks.store import TraceStore
    >>> Neighbourhood(TraceStore(), Tracer(model_names=("m",))).occupancies(0, 10)[0]
    []
    """

    def __init__(self, store, tracer, *, clock_ns: Callable[[], int] = time.perf_counter_ns,
                 max_requests: int = MAX_WINDOW_REQUESTS, local_store=None) -> None:
        self._store = store
        # What `recent_only` reads: this process's records (a database-backed store's ring),
        # for the diagnosis on the tracer's worker, which must not wait on a database; a
        # request that just finished overlapped only requests this process still holds.
        self._local_store = store if local_store is None else local_store
        self._tracer = tracer
        self._clock_ns = clock_ns
        self.max_requests = max_requests
        self._steps_between: Callable[[int, int], list] | None = None
        self.step_log_size: int | None = None      # None: no step record (a proxy)

    def attach_steps(self, between: Callable[[int, int], list], capacity: int) -> None:
        """The engine's step record: `between(from_ns, to_ns)` → its steps overlapping it."""
        self._steps_between = between
        self.step_log_size = capacity

    def steps(self, from_ns: int, to_ns: int) -> list | None:
        return None if self._steps_between is None else self._steps_between(from_ns, to_ns)

    def occupancies(self, from_ns: int, to_ns: int, *,
                    recent_only: bool = False) -> tuple[list[Occupancy], int]:
        """(the requests overlapping the window, oldest start first; how many more were
        left out past `max_requests`). A request finishing as this runs is counted once.
        `recent_only`: this process's records only, never a database read."""
        found: dict[str, Occupancy] = {}
        now_ns = self._clock_ns()
        for active in self._tracer.in_flight():
            snap = active.timeline.snapshot()
            if snap.start_ns <= to_ns:
                found[active.request_id] = of_snapshot(
                    snap, self._tracer.stages, request_id=active.request_id,
                    trace_id=active.trace_id, model=active.model, now_ns=now_ns)
        store = self._local_store if recent_only else self._store
        for record in store.overlapping(from_ns, to_ns):
            found[record.request_id] = of_record(record)      # finished wins
        rows = sorted(found.values(), key=lambda o: (o.start_ns, o.request_id))
        num_more = max(len(rows) - self.max_requests, 0)
        return rows[num_more:], num_more

    def neighbours_of(self, record: RequestRecord, from_ns: int | None = None,
                      to_ns: int | None = None, *,
                      recent_only: bool = False) -> list[Neighbour]:
        """The requests overlapping [from_ns, to_ns] of `record`'s life (default: its time
        to first token, or its whole interval without one), the largest blame first."""
        if from_ns is None:
            from_ns = record.start_ns
        if to_ns is None:
            to_ns = record.end_ns if record.ttft_ns is None else record.start_ns + record.ttft_ns
        others, _ = self.occupancies(from_ns, to_ns, recent_only=recent_only)
        return neighbours(of_record(record), others, from_ns, to_ns, self.steps(from_ns, to_ns))
