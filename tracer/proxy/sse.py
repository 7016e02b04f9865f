"""Read an OpenAI-style SSE stream as it is relayed, without holding it back or changing it.

The proxy relays every upstream byte chunk as it arrives; this scanner looks at the same
bytes on the side to find what TTFT is about: the first event with content, by the one rule
shared with the load generator and the browser probe (`tracer.record.first_content`): any
choice with a non-empty `delta.content`, `text` or `message.content`. Role-only and
usage-only events are not tokens (docs/reference.md, "How benchmark clients define the
numbers");
llama-cpp-python sends a role-only delta right before the first content.

Other outputs (docs/architecture.md, "First output, by kind"): the first reasoning and the
first tool call are reported as `moments`, with each tool call's start and ready
(`tracer.record.tool_calls`), for the relay to time; the count stays the text's.

Cost: the rule runs on what can change the record. Until the first output of any kind, each
event is JSON-parsed and judged by the OpenAI rule (role-only and usage-only events come
first, and are few). After it, an event is parsed again only when it may say something the
record needs: a key of the summary or a tool call (a finish reason, `usage`, llama.cpp's
`timings`, vLLM's `metrics`, an `error`, `tool_calls`, `function_call`), every event while a
tool call is open, and, before the first text, an event that may start the first reasoning.
The others are judged by regular expressions that agree with the rule on valid JSON
(tests/fixtures/sse/ checks it): no `_CONTENT` hit means no content, a `_PLAIN_CONTENT` match
means content, and only what lies between (content outside the first choice, or a lookalike
such as `reasoning_details[].text`) is parsed.

Per stream, not per event: a content event that `_PLAIN_CONTENT` matched gives its bytes up to
its content string (`data: {"id":...,"choices":[{"index":0,"delta":{"content":"`), and the
upstream's next content events start with the same bytes. One with that prefix, a non-empty
string after it and no line end or summary key in the rest (`_REST`, one pass over the rest)
is content without further reading; a read that is one such event whole (the common read)
costs that check alone. A prefix that stops matching is learnt again from the next plain
content event, up to `_MAX_LEARNS` times in a row without a hit.

The bytes after the string are learnt with the prefix (`"}}]}` or
`"},"logprobs":null,"finish_reason":null}]}`: the same in every content event of a stream).
An event that is the learnt prefix, then bytes without a quote or a line end (not ending in a
backslash, so the next quote closes the string), then the learnt suffix, is a content event
with nothing for the summary: its string is non-empty and closes right where the suffix
starts, and the suffix had no summary key when it was learnt. That check is two byte
comparisons and one scan over the text alone (`_PLAIN_STRING`), not over the event's rest;
text with a quote or an escape before the closing quote, or another suffix, takes the
`_REST` pass as before.
"""
from __future__ import annotations

import json
import re

from tracer.proxy.stream_summary import StreamSummary, fill_summary
from tracer.record.first_content import CONTENT, KIND_NAMES, NEITHER, REASONING, RULES
from tracer.record.sse_vocabulary import DONE_DATA_BYTES
from tracer.record.tool_calls import ToolCallTracker

# Any key "content" or "text" with a non-empty string value, wherever it is: every content
# event has one (keys are never \u-escaped in practice), so no hit means no content. A hit may
# be a lookalike (`reasoning_details[].text`, a `content` outside `choices`).
# The lookbehind skips an escaped quote, i.e. the words inside a string value;
# `"reasoning_content"` does not match because `_` precedes `content"`.
_CONTENT = re.compile(rb'(?<!\\)"(?:content|text)"\s*:\s*"(?!")')
# The common shape, for sure content: a top-level `choices` whose FIRST choice has a non-empty
# `text` string or `delta`/`message` object with a non-empty `content` string, reached without
# entering any other object or array (`[^{}\[\]]` cannot leave the current level, and an
# unescaped quote before a key name cannot be inside a string). Anything else is parsed.
_PLAIN_CONTENT = re.compile(
    rb'\s*\{[^{}\[\]]*(?<!\\)"choices"\s*:\s*\[\s*\{[^{}\[\]]*?(?<!\\)'
    rb'(?:"text"|"(?:delta|message)"\s*:\s*\{[^{}\[\]]*?(?<!\\)"content")\s*:\s*"(?!")')
# A key whose event may fill the summary or start a tool call, after its opening quote.
_SUMMARY_KEY = (rb'finish_reason"\s*:\s*"|usage"\s*:\s*\{|timings"\s*:|error"\s*:'
                rb'|tool_calls"\s*:|function_call"\s*:|metrics"\s*:\s*\{')
_SUMMARY = re.compile(rb'"(?:' + _SUMMARY_KEY + rb')')
# The rest of a one-line event after a learnt prefix: no line end and no `_SUMMARY` hit
# (possessive, so a miss never backtracks).
_REST = re.compile(rb'(?:[^"\r\n]++|"(?!(?:' + _SUMMARY_KEY + rb')))*+')
# A content string's bytes between a learnt prefix and a learnt suffix: no quote, no line end.
_PLAIN_STRING = re.compile(rb'[^"\r\n]*+')
# The rest of a JSON string from after its opening quote, through its closing quote.
_STRING_END = re.compile(rb'(?:[^"\\]++|\\.)*+"', re.S)
_BACKSLASH = 92
# Before the first text: an event that may carry reasoning (the OpenAI rule's
# `reasoning_content` or `reasoning`), parsed until the first reasoning has been seen.
_REASONING = re.compile(rb'"reasoning(?:_content)?"\s*:\s*"(?!")')
# A learnt prefix that stops matching is learnt again this many times without a hit in
# between; an upstream whose every event starts differently then stops paying for it.
_MAX_LEARNS = 8
_OPENAI_RULE = RULES["openai"]
_BOM = b"\xef\xbb\xbf"   # UTF-8's byte order mark: one at the start is ignored
# A stream that never sends a blank line would otherwise grow the buffer without bound.
DEFAULT_MAX_EVENT_BYTES = 1 << 20


class SSEScanner:
    """Incremental SSE reader: feed it the relayed chunks, it counts content events.

    >>> scanner = SSEScanner()
    >>> scanner.feed(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\\n\\n')
    0
    >>> scanner.feed(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\\n\\ndata: [DO')
    1
    >>> scanner.feed(b'NE]\\n\\n'), scanner.summary.done, scanner.pending
    (0, True, False)
    """

    __slots__ = ("summary", "_buf", "_max_event_bytes", "_skipping", "_at_start", "_after_cr",
                 "moments", "_kinds_seen", "_tools", "_parse_all", "_calls_open", "_prefix",
                 "_learnt", "_learns_left", "_suffix", "_tail")
    _format = "openai"

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.summary = StreamSummary()
        # Since the relay last took them: ("output", kind name, None) for the first output
        # of each kind other than text, ("start", key, name) and ("ready", key, None) for
        # tool calls (`tracer.record.tool_calls`).
        self.moments: list[tuple[str, object, object]] = []
        self._kinds_seen: set[int] = set()
        self._tools = ToolCallTracker()
        self._buf = b""
        self._max_event_bytes = max_event_bytes
        self._skipping = False   # inside an over-long event: ignore bytes until it ends
        self._at_start = True    # no byte read yet past a possible byte order mark
        self._after_cr = False   # the last read ended with CR: a LF first in the next is its
        # Per stream: every event is parsed until the first output, and while a call is open.
        self._parse_all = True
        self._calls_open = False
        # The learnt bytes before a content event's string (module docstring); `_prefix` is
        # them while no call is open, else None.
        self._prefix: bytes | None = None
        self._learnt: bytes | None = None
        self._learns_left = _MAX_LEARNS
        # The learnt bytes after that string, from its closing quote (`_suffix`), and the
        # same with the blank line that ends the event (`_tail`): b"" until learnt.
        self._suffix = self._tail = b""

    @property
    def pending(self) -> bool:
        """A partial event has been relayed: an appended event must start on a fresh line."""
        return bool(self._buf)

    def feed(self, chunk: bytes) -> int:
        """The number of content events completed by `chunk`."""
        prefix = self._prefix
        if (prefix is not None and not self._buf and not self._skipping
                and chunk.startswith(prefix)):
            # One whole content event of the learnt shape: the common read.
            n, tail = len(prefix), self._tail
            if tail and chunk.endswith(tail):
                end = len(chunk) - len(tail)
                if (n < end and chunk[end - 1] != _BACKSLASH
                        and _PLAIN_STRING.fullmatch(chunk, n, end) is not None):
                    self._after_cr = False
                    self._learns_left = _MAX_LEARNS
                    self.summary.num_content_events += 1
                    return 1
            if (chunk.endswith(b"\n\n") and chunk[n] != 34
                    and _REST.fullmatch(chunk, n, len(chunk) - 2) is not None):
                self._after_cr = False
                self._learns_left = _MAX_LEARNS
                self.summary.num_content_events += 1
                return 1
        if self._at_start:
            chunk = self._skip_bom(chunk)
            if not chunk:
                return 0
        if self._after_cr and chunk:
            self._after_cr = False
            if chunk[:1] == b"\n":     # the LF of a CRLF cut by the read
                chunk = chunk[1:]
        if b"\r" in chunk:
            # SSE lines end at CRLF, LF or a lone CR (docs/reference.md, "Proxy routes and
            # stream formats"): all become LF, so a trailing CR ends its line at once.
            self._after_cr = chunk[-1:] == b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        if self._skipping:
            end = buf.find(b"\n\n")
            if end < 0:
                self._buf = buf[-1:]   # keep a possible first half of the blank line
                return 0
            buf, self._skipping = buf[end + 2:], False
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        if len(self._buf) > self._max_event_bytes:
            self._buf, self._skipping = b"", True   # bounded memory; the relay goes on
        num_content = 0
        for event in events:
            num_content += self._event(event)
        return num_content

    def _skip_bom(self, chunk: bytes) -> bytes:
        """The stream's one leading byte order mark is not part of it; a read may cut it."""
        head = self._buf + chunk
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._buf = head    # all BOM so far: the next read tells
            return b""
        self._at_start, self._buf = False, b""
        return head[len(_BOM):] if head.startswith(_BOM) else head

    def _event(self, event: bytes) -> int:
        prefix = self._prefix
        if prefix is not None and event.startswith(prefix):
            n, suffix = len(prefix), self._suffix
            if suffix and event.endswith(suffix):
                end = len(event) - len(suffix)
                if (n < end and event[end - 1] != _BACKSLASH
                        and _PLAIN_STRING.fullmatch(event, n, end) is not None):
                    self._learns_left = _MAX_LEARNS
                    self.summary.num_content_events += 1
                    return 1
            if event[n:n + 1] != b'"' and _REST.fullmatch(event, n) is not None:
                self._learns_left = _MAX_LEARNS
                self.summary.num_content_events += 1
                return 1
        data = _data_of(event)
        if data is None:
            return 0
        summary = self.summary
        if data == DONE_DATA_BYTES:
            summary.done = True
            return 0
        if self._parse_all or _SUMMARY.search(data) is not None:
            has_content = self._parse(data)
        elif (plain := _PLAIN_CONTENT.match(data)) is not None:
            has_content = True
            if self._learns_left and len(data) + 6 == len(event) and event.startswith(b"data: "):
                self._learn(event, 6 + plain.end())
        elif _CONTENT.search(data) is not None:
            has_content = self._parse(data)     # a lookalike, or content past choices[0]
        elif (not summary.num_content_events and REASONING not in self._kinds_seen
              and _REASONING.search(data) is not None):
            has_content = self._parse(data)     # may be the first reasoning
        else:
            has_content = False
        if has_content:
            summary.num_content_events += 1
            return 1
        return 0

    def _learn(self, event: bytes, n: int) -> None:
        """The bytes before this plain content event's string (`event[:n]`) and after it,
        for the next ones. The event is one `data:` line with no summary key."""
        prefix = event[:n]
        if prefix != self._learnt:
            self._learns_left -= 1
            self._learnt = prefix
            close = _STRING_END.match(event, n)
            # From the closing quote on; b"": none (a string never closed), no suffix check.
            self._suffix = event[close.end() - 1:] if close is not None else b""
            self._tail = self._suffix + b"\n\n" if self._suffix else b""
            if not self._calls_open:
                self._prefix = prefix

    def _parse(self, data: bytes) -> bool:
        """Fill the summary from one event's JSON; True when it carries content."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):   # RecursionError: nested past the stack
            return False   # an event we cannot read is not content; the relay goes on
        fill_summary(self.summary, obj)
        # One classification: the OpenAI rule's CONTENT is `is_content_event`, and its other
        # kinds are the moments.
        return self._outputs(obj, _OPENAI_RULE(obj)) == CONTENT

    def _outputs(self, obj: object, kind: int | None) -> int | None:
        """Note the first output of each kind but text, and the tool-call moments."""
        if kind is not None and kind != NEITHER and kind != CONTENT and kind not in self._kinds_seen:
            self._kinds_seen.add(kind)
            self.moments.append(("output", KIND_NAMES[kind], None))
        tools = self._tools
        self.moments += tools.feed(self._format, obj)
        # What the next events cost follows from here, once per parsed event.
        self._calls_open = calls_open = tools.num_open > 0
        self._prefix = None if calls_open else self._learnt
        self._parse_all = calls_open or not (kind == CONTENT or self._kinds_seen
                                             or self.summary.num_content_events)
        return kind

    def take_moments(self) -> list[tuple[str, object, object]]:
        moments, self.moments = self.moments, []
        return moments


def _data_of(event: bytes) -> bytes | None:
    """The joined `data:` lines of one event (None for comments and other fields)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:") or line == b"data":   # a bare name: an empty value
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None
