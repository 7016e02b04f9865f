"""Reads one streamed response body as it arrives and finds its content events, of any format.

The byte-level half of `tracer.record.first_content`, doing what the browser probe
(frontend_probe/probe.js, `consumer`) does: how the body is read follows what arrived (or a
forced format), and each event is judged by its format's rule, the format being the first
one whose rule recognises an event's shape unless the headers already said:

- `text/plain` (the AI SDK's text stream): each non-empty decoded piece is content;
- NDJSON (`application/x-ndjson`, Ollama): one event per non-blank line;
- other JSON: one non-streamed body, judged when it ends;
- anything else: `text/event-stream`, parsed per the SSE spec (lines end at \\r\\n, \\r or
  \\n, a blank line dispatches, `:` lines are comments, `data:` lines join with \\n).

UTF-8 is decoded incrementally, so a character split across reads is never mangled, and an
event split across reads counts in the read that completes it. A line longer than
`max_line_bytes` is dropped (counted in `errors`), so memory stays bounded.

Tool calls: each event also goes through `tracer.record.tool_calls`, whose moments (a call
started, its arguments complete) wait in `take_tool_moments`.

Standard library only; of tracer, it imports `tracer.record.first_content`,
`tracer.record.sse_vocabulary` and `tracer.record.tool_calls` alone.
"""
from __future__ import annotations

import codecs
import json
import re

from tracer.record.first_content import (CONTENT, FORMATS, NEITHER, REASONING, TOOL_CALL,
                                         classify, is_timing_token)
from tracer.record.sse_vocabulary import DONE_DATA
from tracer.record.tool_calls import ToolCallTracker

__all__ = ["ContentStream", "UI_STREAM_HEADER"]

# The AI SDK UI message stream's response header (ai 7.0.173, UI_MESSAGE_STREAM_HEADERS).
UI_STREAM_HEADER = "x-vercel-ai-ui-message-stream"
DEFAULT_MAX_LINE_BYTES = 1 << 20
_EOL = re.compile(r"\r\n|\r|\n")
_TIMING_PREFIX = "ttft-timing "


class ContentStream:
    """Feed it the body's reads; each `feed` returns the kinds of the events it completed.

    >>> s = ContentStream("text/event-stream")
    >>> s.feed(b'data: {"type":"message_start","message":{}}\\n\\ndata: {"type":"content_blo')
    [0]
    >>> s.feed(b'ck_delta","delta":{"type":"text_delta","text":"Hi"}}\\n\\n'), s.format
    ([1], 'anthropic')
    >>> s = ContentStream("text/plain; charset=utf-8")
    >>> s.feed("é".encode()[:1]), s.feed("é".encode()[1:]), s.format
    ([], [1], 'text')
    """

    def __init__(self, content_type: str = "", headers: dict[str, str] | None = None,
                 fmt: str | None = None, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if fmt is not None and fmt not in FORMATS or fmt == "custom":
            raise ValueError(f"format must be one of {', '.join(FORMATS[:-1])}, got {fmt!r}")
        headers = {k.lower(): v for k, v in (headers or {}).items()}
        ctype = content_type.lower()
        self._plain = fmt == "text" if fmt else ctype.startswith("text/plain")
        self.format: str | None = fmt or ("text" if self._plain else
                                          "ai-sdk-ui" if headers.get(UI_STREAM_HEADER) else None)
        self._ndjson = "ndjson" in ctype or "jsonl" in ctype
        self._json_body = not self._ndjson and "json" in ctype
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""
        self._data: list[str] = []
        self._max = max_line_bytes
        self.server_token: str | None = None    # the engine's signed timing, when it came
        self.done = False                       # `data: [DONE]` seen
        self.errors = 0                         # unparsable events, over-long lines
        self.num_events = 0                     # events completed, [DONE] included
        self._tools = ToolCallTracker()
        self.tool_moments: list[tuple[int, str, object, str | None]] = []

    def feed(self, chunk: bytes) -> list[int]:
        """The kinds (CONTENT, TOOL_CALL, REASONING, NEITHER) of the events `chunk` completed."""
        return self._text(self._decoder.decode(chunk), end=False)

    def close(self) -> list[int]:
        """The kinds of what the end of the body completes (a last line, a JSON body)."""
        return self._text(self._decoder.decode(b"", final=True), end=True)

    def _text(self, text: str, *, end: bool) -> list[int]:
        if self._plain:
            return [CONTENT] if text else []
        self._buf += text
        if self._json_body:
            if not end:
                return self._bound([])
            body, self._buf = self._buf, ""
            return [self._event(body)]
        kinds: list[int] = []
        while True:
            cut = self._line_end(end)
            if cut is None:
                break
            start, stop = cut
            line, self._buf = self._buf[:start], self._buf[stop:]
            self._line(line, kinds)
        if end and self._ndjson and self._buf.strip():
            self._line(self._buf, kinds)
        if end:
            self._buf = ""
        return self._bound(kinds)

    def _line_end(self, end: bool) -> tuple[int, int] | None:
        """Where the first line ends: (its end, the next line's start). A \\r at the very end
        may be the first half of a \\r\\n split across reads: wait, unless the body ended."""
        m = _EOL.search(self._buf)
        if m is None or (not end and m.group() == "\r" and m.end() == len(self._buf)):
            return None
        return m.start(), m.end()

    def _bound(self, kinds: list[int]) -> list[int]:
        if len(self._buf) > self._max:
            self._buf, self._data = "", []
            self.errors += 1
        return kinds

    def _line(self, line: str, kinds: list[int]) -> None:
        if self._ndjson:
            if line.strip():
                kinds.append(self._event(line))
        elif not line:
            if self._data:
                data, self._data = "\n".join(self._data), []
                if data == DONE_DATA:
                    self.done = True
                    self.num_events += 1
                    kinds.append(NEITHER)
                else:
                    kinds.append(self._event(data))
        elif line.startswith(":"):
            self._comment(line[1:])
        else:
            field, colon, value = line.partition(":")
            if field == "data":
                self._data.append(value[1:] if colon and value.startswith(" ") else value)

    def _comment(self, text: str) -> None:
        # `: ttft-timing <token>` (docs/reference.md); the first one is the answering server's
        text = text[1:] if text.startswith(" ") else text
        token = text[len(_TIMING_PREFIX):]
        if self.server_token is None and text.startswith(_TIMING_PREFIX) and is_timing_token(token):
            self.server_token = token

    def _event(self, data: str) -> int:
        self.num_events += 1
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):   # RecursionError: nested past the stack
            self.errors += 1
            return NEITHER
        fmt, kind = classify(event, self.format)
        if kind is None:
            return NEITHER
        self.format = fmt
        if isinstance(kind, str):       # the AI SDK data part's timing token
            self.server_token = self.server_token or kind
            return NEITHER
        self._tool_moments(fmt, event)
        return kind if kind in (CONTENT, REASONING, TOOL_CALL) else NEITHER

    def _tool_moments(self, fmt: str, event: object) -> None:
        for action, key, name in self._tools.feed(fmt, event):
            self.tool_moments.append((self.num_events - 1, action, key, name))

    def take_tool_moments(self) -> list[tuple[int, str, object, str | None]]:
        """The tool-call moments since the last call: (event index, START or READY, key,
        name), the event index counting every event as the kinds lists do."""
        moments, self.tool_moments = self.tool_moments, []
        return moments
