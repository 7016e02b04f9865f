"""Where the proxy's `: ttft-timing` line goes in the relayed bytes, for a client that opted in
(tracer/web/inband.py): right before the upstream's `data: [DONE]`, and nowhere else.

The line the client gets is the one from the hop that answers it. An upstream's own line
(an engine or another proxy that was asked, or one that sends it unasked) is removed from
the relayed bytes: the probe would otherwise hold two, and a token signed by a key the
client's collector does not know makes the beacon be refused (docs/reference.md, "The
in-band timing line"). Both rewrites work across reads and hold back only bytes that may be
the start of what they look for, until the next read tells.
"""
from __future__ import annotations

from tracer.record.sse_vocabulary import DONE_DATA_BYTES

# The `data` field may follow the colon with or without the one space SSE strips.
_DONE_LINES = (b"data: " + DONE_DATA_BYTES, b"data:" + DONE_DATA_BYTES)
# A blank line ends an event: two line ends in a row, each CRLF, LF or CR (WHATWG HTML,
# "Interpreting an event stream"); a CRLF alone is one line end, not two.
_BOUNDARIES = (b"\n\n", b"\r\r", b"\n\r", b"\r\r\n", b"\n\r\n")
# The comment's field as the probe reads it: ':' then an optional space (SSE strips one).
_TIMING_LINES = (b": ttft-timing", b":ttft-timing")
_CR, _LF = 13, 10


class DoneSplitter:
    r"""Finds where the upstream's `data: [DONE]` event starts, across reads, so the proxy can
    put its own line right before it. Bytes that might be the start of that event are held
    back until the next read tells (at most 11 bytes, only when a read ends inside them);
    everything else passes at once.

    >>> s = DoneSplitter()
    >>> s.feed(b'data: {"x":1}\n\ndata: [DO')
    (b'data: {"x":1}\n\n', None)
    >>> s.feed(b'NE]\n\n')
    (b'', b'data: [DONE]\n\n')
    >>> DoneSplitter().feed(b'data: {"t":"data: [DONE]"}\n\n')   # inside an event: not it
    (b'data: {"t":"data: [DONE]"}\n\n', None)
    """

    __slots__ = ("found", "_held", "_prev")

    def __init__(self) -> None:
        self.found = False
        self._held = b""
        self._prev: bytes | None = None   # the last bytes passed on (None: stream start)

    def feed(self, chunk: bytes) -> tuple[bytes, bytes | None]:
        """(bytes to send now, the bytes from the [DONE] event on, or None)."""
        if self.found:
            return chunk, None
        data = self._held + chunk if self._held else chunk
        self._held = b""
        at = data.find(DONE_DATA_BYTES)
        while at >= 0:
            end = at + len(DONE_DATA_BYTES)
            start = data.rfind(b"data:", 0, at)
            if start >= 0 and data[start:end] in _DONE_LINES and self._event_start(data, start):
                self.found = True
                self._pass(data[:start])
                return data[:start], data[start:]
            at = data.find(DONE_DATA_BYTES, end)
        line_start = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        tail = data[line_start:]
        if (tail and any(d.startswith(tail) and d != tail for d in _DONE_LINES)
                and self._event_start(data, line_start)):
            self._held = tail
            data = data[:line_start]
        self._pass(data)
        return data, None

    def flush(self) -> bytes:
        """What is still held back (the stream ended)."""
        held, self._held = self._held, b""
        return held

    def _event_start(self, data: bytes, at: int) -> bool:
        if at == 0 and self._prev is None:
            return True
        before = (self._prev or b"") + data[:at]
        return before.endswith(_BOUNDARIES)

    def _pass(self, data: bytes) -> None:
        if data:
            self._prev = ((self._prev or b"") + data)[-4:]


class TimingLineStripper:
    r"""Removes every `: ttft-timing ...` comment line (SSE lines end at CR, LF or CRLF) from
    the relayed bytes; everything else passes unchanged. A read without the marker and not
    ending inside a possible one costs two byte searches.

    >>> s = TimingLineStripper()
    >>> s.feed(b'data: {"x":1}\n\n: ttft-timing abc.def\n\ndata: [DONE]\n\n')
    b'data: {"x":1}\n\n\ndata: [DONE]\n\n'
    >>> s.feed(b': ttft-tim'), s.feed(b'ing x\r\n: keep\r\n')
    (b'', b': keep\r\n')
    >>> TimingLineStripper().feed(b'data: {"c":"\\n: ttft-timing"}\n\n')   # inside data
    b'data: {"c":"\\n: ttft-timing"}\n\n'
    """

    __slots__ = ("num_stripped", "_held", "_dropping", "_drop_lf", "_line_start")

    def __init__(self) -> None:
        self.num_stripped = 0
        self._held = b""
        self._dropping = False     # inside a timing line: drop up to its line end
        self._drop_lf = False      # a dropped line ended with CR at a read's end
        self._line_start = True    # the next byte starts a line

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        data = self._held + chunk if self._held else chunk
        self._held = b""
        if (self._dropping or self._drop_lf or b"ttft-timing" in data
                or (data[-1] not in b"\r\n" and self._may_start(data))):
            return self._rewrite(data)
        self._line_start = data[-1] in b"\r\n"
        return data

    def flush(self) -> bytes:
        """What is still held back (the stream ended): it was not a timing line."""
        held, self._held = self._held, b""
        return held

    def _may_start(self, data: bytes) -> bool:
        """Whether `data` ends inside what may be the start of a timing line."""
        at = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if at == 0 and not self._line_start:
            return False
        tail = data[at:]
        return any(line.startswith(tail) for line in _TIMING_LINES)

    def _rewrite(self, data: bytes) -> bytes:
        out, i, n = [], 0, len(data)
        if self._drop_lf:
            self._drop_lf = False
            if data[:1] == b"\n":
                i = 1
        while i < n:
            if self._dropping:
                end = _line_end(data, i)
                if end < 0:
                    break                       # the rest of the read is the dropped line
                self._dropping, self._line_start = False, True
                i = end + 1
                if data[end] == _CR:
                    if i == n:
                        self._drop_lf = True    # its LF, if any, is in the next read
                    elif data[i] == _LF:
                        i += 1
                continue
            if self._line_start:
                head = data[i:i + len(_TIMING_LINES[0])]
                if any(head.startswith(line) for line in _TIMING_LINES):
                    self._dropping = True
                    self.num_stripped += 1
                    continue
                if i + len(head) == n and any(line.startswith(head) for line in _TIMING_LINES):
                    self._held = head           # the next read tells
                    break
            end = _line_end(data, i)
            if end < 0:
                out.append(data[i:])
                self._line_start = False
                break
            stop = end + 2 if data[end] == _CR and end + 1 < n and data[end + 1] == _LF else end + 1
            out.append(data[i:stop])
            self._line_start, i = True, stop
        return b"".join(out)


def _line_end(data: bytes, start: int) -> int:
    """The index of the first CR or LF at or after `start`; -1 when there is none."""
    cr, lf = data.find(b"\r", start), data.find(b"\n", start)
    if cr < 0:
        return lf
    return cr if lf < 0 else min(cr, lf)
