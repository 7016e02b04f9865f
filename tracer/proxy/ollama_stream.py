"""Read Ollama's native answers (`/api/chat`, `/api/generate`) as they are relayed.

A streamed answer is NDJSON (`application/x-ndjson`): one JSON object a line, the last with
`"done": true` (ollama/ollama api/types.go, `ChatResponse`, `GenerateResponse`). The first
token is the first line with text by the Ollama rule of `tracer.record.first_content`
(`message.content` on /api/chat, `response` on /api/generate; `thinking` is reasoning,
`message.tool_calls` a tool call): one rule, shared with the probe. What the stream says of
the whole answer, mapped to the chat path's summary:

- the final line: `done_reason` (`stop`, `length`, any other as is: the metric label is
  closed anyway) and the timing fields of `tracer.engines.ollama` (kept in
  `StreamSummary.ollama_final`); `prompt_eval_count` / `eval_count` as the usage;
- an `{"error": "..."}` line: Ollama's in-band error (its routes send one when a stream
  fails part way), an upstream error here.

A line may be split across reads: the part after the last newline waits for the next read,
bounded like the SSE scanner's events (`DEFAULT_MAX_EVENT_BYTES`): a longer line is skipped
to its end, never buffered. A blank line is nothing.
"""
from __future__ import annotations

import json

from tracer.engines import ollama
from tracer.proxy.formats import set_usage
from tracer.proxy.sse import DEFAULT_MAX_EVENT_BYTES, SSEScanner
from tracer.proxy.stream_summary import StreamSummary
from tracer.record.first_content import CONTENT, RULES
from tracer.record.token_counts import MAX_TOKENS_PER_REQUEST
from tracer.record.tool_calls import ToolCallTracker

__all__ = ["OllamaScanner", "error_line", "summarize_ollama_body"]

FORMAT = "ollama"
_RULE = RULES[FORMAT]
_FINISH = {"stop": "stop", "length": "length"}
_MAX_ERROR_CHARS = 512


def _count(value) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_TOKENS_PER_REQUEST else None


def absorb_ollama(summary: StreamSummary, obj: dict) -> None:
    """What one line (or a whole non-streamed answer) says of the answer."""
    error = obj.get("error")
    if error is not None:
        summary.error = {"message": error[:_MAX_ERROR_CHARS] if isinstance(error, str)
                         else "error"}
    if obj.get("done") is not True:
        return
    summary.done = True
    reason = obj.get("done_reason")
    if isinstance(reason, str) and reason:
        summary.finish_reason = _FINISH.get(reason, reason)
    summary.ollama_final = {k: obj[k] for k in ollama.FIELDS if k in obj}
    set_usage(summary, prompt=_count(obj.get(ollama.PROMPT_TOKENS)),
              output=_count(obj.get(ollama.OUTPUT_TOKENS)))


class OllamaScanner(SSEScanner):
    """The NDJSON scanner: feed it the relayed reads, it counts lines with text.

    >>> s = OllamaScanner()
    >>> s.feed(b'{"message":{"role":"assistant","content":""},"done":false}\\n{"mess')
    0
    >>> s.feed(b'age":{"content":"Hi"},"done":false}\\n'), s.pending
    (1, False)
    >>> s.feed(b'{"message":{"content":""},"done":true,"done_reason":"stop","eval_count":1}\\n')
    0
    >>> s.summary.done, s.summary.finish_reason, s.summary.usage
    (True, 'stop', {'completion_tokens': 1})
    """

    __slots__ = ()
    _format = FORMAT

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes=max_line_bytes)

    def feed(self, chunk: bytes) -> int:
        """The number of lines with text completed by `chunk`."""
        buf = self._buf + chunk if self._buf else chunk
        if self._skipping:
            end = buf.find(b"\n")
            if end < 0:
                self._buf = b""
                return 0
            buf, self._skipping = buf[end + 1:], False
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > self._max_event_bytes:
            self._buf, self._skipping = b"", True   # bounded memory; the relay goes on
        num_content = 0
        for line in lines:
            num_content += self._line(line)
        return num_content

    def _line(self, line: bytes) -> int:
        if not line.strip():
            return 0
        try:
            obj = json.loads(line)   # a trailing CR is whitespace to JSON
        except (ValueError, RecursionError):   # RecursionError: nested past the stack
            return 0   # a line we cannot read is not content; the relay goes on
        if not isinstance(obj, dict):
            return 0
        absorb_ollama(self.summary, obj)
        if self._outputs(obj, _RULE(obj)) == CONTENT:
            self.summary.num_content_events += 1
            return 1
        return 0


def summarize_ollama_body(body: bytes) -> tuple[StreamSummary, bool, list]:
    """(summary, has content, tool-call moments) of a non-streamed answer (`"stream":
    false`): one object shaped like a final line, its text whole."""
    summary = StreamSummary()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return summary, False, []
    if not isinstance(obj, dict):
        return summary, False, []
    absorb_ollama(summary, obj)
    has_content = _RULE(obj) == CONTENT
    summary.num_content_events = int(has_content)
    return summary, has_content, ToolCallTracker().feed(FORMAT, obj)


def error_line(pending: bool, message: str) -> bytes:
    """The proxy's own error for a cut stream, in Ollama's in-band shape, on a fresh line
    when a partial line was relayed.

    >>> error_line(True, "cut")
    b'\\n{"error":"cut"}\\n'
    """
    line = json.dumps({"error": message}, separators=(",", ":")).encode() + b"\n"
    return b"\n" + line if pending else line
