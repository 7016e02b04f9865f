"""Which backend span names may become a metric label (docs/architecture.md, "Closed label
vocabulary"; "The whole path").

A backend's span names are its own (`retrieve`, `SELECT docs`, `POST /chat`), and a
hostile or careless exporter can send a new one with every request. The segments of the
whole path keep their span names on the record (for /ui), but a metric's `segment` label is
one of a closed set: the names configured up front (`--path-segment`), plus at most `top_n`
learned ones, plus `other`. A learned name is admitted while a slot is free, once it has been
on the critical path of `min_traces` traces and is among the `top_n` candidates with the
most critical-path time so far. Candidates live in a bounded table; a new name that finds it
full replaces the one with the least time, from zero (it inherits nothing, so a flood of
one-off names never reaches `min_traces` and never takes a slot). Once admitted a name
stays: a label never changes meaning or disappears while the process runs, and the label
set never exceeds `configured + top_n + 1`.

Runs on one thread (the collector's event loop).
"""
from __future__ import annotations

OTHER = "other"
# Longer names are cut before they are counted or shown.
MAX_NAME_CHARS = 64
DEFAULT_TOP_N = 8
# A name recurs before it is a label: one-off names (ids, timestamps in names) never are.
DEFAULT_MIN_TRACES = 3


def segment_name(raw: str) -> str:
    """A span name as a segment name: control characters out, cut, never empty.

    >>> segment_name("SELECT docs\\n"), segment_name(""), len(segment_name("x" * 99))
    ('SELECT docs', 'unnamed', 64)
    """
    name = "".join(ch for ch in raw if ch.isprintable())[:MAX_NAME_CHARS].strip()
    return name or "unnamed"


class SegmentNames:
    """The closed label vocabulary of backend segments.

    >>> names = SegmentNames(configured=("retrieve",), top_n=1, min_traces=2)
    >>> for _ in range(2): names.observe("SELECT docs", 30); names.observe("auth", 5)
    >>> names.observe("x", 99)      # once: not yet a label
    >>> names.label("retrieve"), names.label("SELECT docs"), names.label("auth"), names.label("x")
    ('retrieve', 'SELECT docs', 'other', 'other')
    >>> names.labels()
    ('retrieve', 'SELECT docs', 'other')
    """

    def __init__(self, configured: tuple[str, ...] = (), top_n: int = DEFAULT_TOP_N, *,
                 min_traces: int = DEFAULT_MIN_TRACES, candidates: int | None = None) -> None:
        if top_n < 0 or min_traces < 1:
            raise ValueError("top_n must be >= 0 and min_traces >= 1")
        self.configured = tuple(dict.fromkeys(segment_name(n) for n in configured))
        self.top_n = top_n
        self.min_traces = min_traces
        self._capacity = max(candidates if candidates is not None else 8 * top_n, top_n, 1)
        self._learned: list[str] = []
        # candidate → [critical-path ns, observations]
        self._seen: dict[str, list[int]] = {}

    def observe(self, name: str, ns: int) -> None:
        """`ns` more critical-path time spent in `name` (a `segment_name`), once per trace."""
        if name in self.configured or name in self._learned or self.top_n == 0:
            return
        table = self._seen
        entry = table.get(name)
        if entry is None:
            if len(table) >= self._capacity:
                del table[min(table, key=lambda n: table[n][0])]
            entry = table[name] = [0, 0]
        entry[0] += ns
        entry[1] += 1
        if len(self._learned) < self.top_n and entry[1] >= self.min_traces:
            rank = sum(1 for t, _ in table.values() if t > entry[0])
            if rank < self.top_n:
                self._learned.append(name)
                del table[name]

    def label(self, name: str) -> str:
        return name if name in self.configured or name in self._learned else OTHER

    def labels(self) -> tuple[str, ...]:
        """Every label in use so far, `other` last."""
        return self.configured + tuple(self._learned) + (OTHER,)
