"""A recorded response body for the fake upstream (`fake_upstream.py`) to replay as it was
read: in the recorded pieces, with a pause before a chosen byte (the engine's prefill)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Recording:
    """A recorded response body the fake replays: written in pieces at `cuts` (byte offsets),
    after waiting `hold_ms` before the piece that starts at `hold_at`.

    >>> Recording(b"data: x\\n\\n", cuts=(3,)).pieces()
    [b'dat', b'a: x\\n\\n']
    """

    body: bytes
    content_type: bytes = b"text/event-stream"
    cuts: tuple[int, ...] = ()
    hold_at: int | None = None
    hold_ms: float = 0.0

    def pieces(self) -> list[bytes]:
        bounds = sorted({0, len(self.body), *self.cuts,
                         *(() if self.hold_at is None else (self.hold_at,))})
        return [self.body[a:b] for a, b in zip(bounds, bounds[1:])]
