"""Was the stream held back on its way to the browser? Send times against arrival times.

An intermediary that buffers a response (nginx `proxy_buffering on`, a CDN, a corporate
proxy, a compression middleware) releases the early events late, together with later ones:
the user sees nothing, then a burst, while the server's TTFT looks fine. The server knows
when it sent each content event (`send_ms` of the in-band timing line, or the record's own
emits), the probe when each arrived (`chunk_ms`). Over the first k = min(len) events
(docs/reference.md, "Buffering"):

    spread_send   = send_ms[k-1]  - send_ms[0]
    spread_arrive = chunk_ms[k-1] - chunk_ms[0]
    buffered      = k >= 3 and spread_send >= 50 ms and spread_arrive < 0.25 * spread_send
    held_back_ms  = max(spread_send - spread_arrive, 0)

Only differences within one clock are used, so no clock alignment is needed. The thresholds:
k >= 3 so one late pair cannot decide; 50 ms of send spread because below it a stream is too
short (or too fast) for a browser's timer and event loop to tell a burst from a stream; and a
quarter because network jitter compresses or stretches a spread by far less, while a buffer
that holds the opening events compresses it towards zero.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_EVENTS = 3
MIN_SEND_SPREAD_MS = 50.0
MAX_ARRIVAL_SHARE = 0.25


@dataclass(slots=True, frozen=True)
class BufferingVerdict:
    """The detector's answer for one stream that could be judged."""

    buffered: bool
    held_back_ms: float     # send spread not seen as arrival spread (≥ 0)
    num_events: int         # k


def detect_buffering(send_ms: Sequence[float],
                     chunk_ms: Sequence[float]) -> BufferingVerdict | None:
    """The verdict, or None when fewer than `MIN_EVENTS` events can be compared.

    >>> detect_buffering([10, 60, 110, 160], [80, 131, 180, 232])     # streamed
    BufferingVerdict(buffered=False, held_back_ms=0.0, num_events=4)
    >>> detect_buffering([10, 60, 110, 160], [300, 300.5, 301, 301])  # released at once
    BufferingVerdict(buffered=True, held_back_ms=149.0, num_events=4)
    >>> detect_buffering([10, 60], [300, 300]) is None
    True
    """
    k = min(len(send_ms), len(chunk_ms))
    if k < MIN_EVENTS:
        return None
    spread_send = float(send_ms[k - 1]) - float(send_ms[0])
    spread_arrive = float(chunk_ms[k - 1]) - float(chunk_ms[0])
    buffered = (spread_send >= MIN_SEND_SPREAD_MS
                and spread_arrive < MAX_ARRIVAL_SHARE * spread_send)
    return BufferingVerdict(buffered, max(spread_send - spread_arrive, 0.0), k)
