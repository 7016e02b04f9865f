"""`--since` / `--until`: a moment as a person writes it, in unix ms.

- an ISO 8601 date and time, `2026-12-05T14:00` or `2026-12-05 14:00:00+01:00` (without
  an offset: this machine's local time, as a person reading a wall clock means it);
- unix milliseconds, `1764943200000`;
- a time ago: `90s`, `15m`, `2h`, `7d`.
"""
from __future__ import annotations

import re
from datetime import datetime

_AGO = re.compile(r"(\d{1,7})([smhd])")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_when(text: str, now_unix_ms: int) -> int:
    """The moment `text` names, in unix ms; ValueError naming the accepted forms.

    >>> parse_when("15m", 1_000_000_000), parse_when("1764943200000", 0)
    (999100000, 1764943200000)
    >>> parse_when("2026-12-05T14:00:00+00:00", 0)
    1796479200000
    """
    text = text.strip()
    if (ago := _AGO.fullmatch(text)) is not None:
        return now_unix_ms - int(ago[1]) * _UNIT_MS[ago[2]]
    if text.isascii() and text.isdigit() and len(text) <= 15:
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a time: write an ISO date and time "
                         "(2026-12-05T14:00), unix ms, or a time ago (15m, 2h, 7d)") from None
