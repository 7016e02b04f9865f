"""The time range every /ui read takes: `from_unix_ms` / `to_unix_ms`, or `minutes` back
from now, one rule for all of them (docs/reference.md, "The store")."""
from __future__ import annotations

import time

from tracer.web.openai_http import OpenAIError, bounded_int
from tracer.web.ui_timeline import unix_ms_param

_MS = 1_000_000
MAX_UNIX_MS = 10**15 - 1   # 15 digits, as `unix_ms_param` reads: the year 33658
RANGE_PARAMETERS = [
    {"name": "from_unix_ms", "in": "query", "required": False,
     "description": "requests that started at or after this time (unix ms)",
     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_UNIX_MS}},
    {"name": "to_unix_ms", "in": "query", "required": False,
     "description": "requests that started before this time (unix ms; default now)",
     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_UNIX_MS}}]


def time_range(from_unix_ms: str, to_unix_ms: str, *, minutes: str = "",
               max_minutes: int | None = None,
               now_ns: int | None = None) -> tuple[int | None, int | None]:
    """(from, to) in unix ns, None where unbounded: `from_unix_ms`/`to_unix_ms` when
    either is given, else the last `minutes`, else everything. A 400 for a bad value.

    >>> time_range("1000", "2000")
    (1000000000, 2000000000)
    >>> time_range("", "", minutes="2", max_minutes=10, now_ns=600_000_000_000)
    (480000000000, None)
    >>> time_range("", "")
    (None, None)
    """
    if from_unix_ms or to_unix_ms:
        lo = unix_ms_param(from_unix_ms, "from_unix_ms") * _MS if from_unix_ms else None
        hi = unix_ms_param(to_unix_ms, "to_unix_ms") * _MS if to_unix_ms else None
        if lo is not None and hi is not None and hi <= lo:
            raise OpenAIError(400, "to_unix_ms must be after from_unix_ms", param="to_unix_ms",
                              code="invalid_value")
        return lo, hi
    if minutes:
        n = bounded_int(minutes, "minutes", 1, max_minutes or 10**6 - 1)
        now_ns = time.time_ns() if now_ns is None else now_ns
        return now_ns - n * 60 * 1_000_000_000, None
    return None, None
