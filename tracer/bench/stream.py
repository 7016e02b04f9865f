"""Reads one streamed response (SSE) and timestamps it the way benchmark clients do.

For OpenAI chat and completions, a content event is one where any choice has a non-empty
`delta.content`, `text` or `message.content` (`tracer.record.first_content.is_content_event`,
the rule the proxy and the browser probe share). Role-only, finish-only and usage-only
(`choices: []`) events are not tokens: a server that sends `{"role": "assistant", "content":
""}` first must not make TTFT read near zero (vLLM #15106; docs/reference.md, "How benchmark
clients define the numbers"). Anthropic Messages and the Responses API are judged by their own
format's rule (`first_content.classify`, tracer/bench/endpoints.py): `text_delta`,
`response.output_text.delta`; thinking is not a token there either. The first output of any
kind (thinking, a tool call naming its function, text) and the tool calls are kept too
(docs/architecture.md, "First output, by kind"): an answer that only calls tools is an answer.
"""
from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable

from tracer.bench.endpoints import ENDPOINTS
from tracer.bench.stats import RequestResult
from tracer.record.first_content import CONTENT, KIND_NAMES, NEITHER, RULES
from tracer.record.tool_calls import START, ToolCallTracker
from tracer.record.sse_vocabulary import DONE_DATA


class StreamStatus(enum.Enum):
    CREATED = "created"      # not sent yet
    WAITING = "waiting"      # sent, no content yet
    STREAMING = "streaming"  # at least one content event
    DONE = "done"            # `data: [DONE]` (or the API's end event) seen
    FAILED = "failed"


class StreamTimeline:
    """Timestamps the events of one streamed response; `finish()` gives its RequestResult.

    The clock is read when each line arrives, before any JSON parsing.

    Example:
        timeline = StreamTimeline(index=0, endpoint="chat", clock_ns=time.perf_counter_ns)
        timeline.mark_sent()
        async for line in response.aiter_lines():
            timeline.feed_line(line)
            if timeline.is_closed:
                break
        result = timeline.finish()
    """

    def __init__(self, index: int, endpoint: str = "chat",
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        # One content rule covers chat (`delta.content`) and completions (`text`); Messages and
        # Responses have their format's.
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        self._endpoint = ENDPOINTS[endpoint]
        self.index = index
        self.status = StreamStatus.CREATED
        self._clock_ns = clock_ns
        self._sent_ns = 0
        self._content_ns: list[int] = []
        self._done_ns: int | None = None
        self._first_output: tuple[int, str] | None = None
        self._tools = ToolCallTracker()
        self._num_tool_calls = 0
        self._prompt_tokens: int | None = None
        self._completion_tokens: int | None = None
        self._error: tuple[str, str, int | None] | None = None

    @property
    def is_closed(self) -> bool:
        """No more events matter: the stream finished or failed."""
        return self.status in (StreamStatus.DONE, StreamStatus.FAILED)

    def mark_sent(self) -> None:
        self._sent_ns = self._clock_ns()
        self.status = StreamStatus.WAITING

    def feed_line(self, line: str) -> None:
        """One raw SSE line; comments, blank lines and non-`data` fields are ignored."""
        if line.startswith("data:"):
            self.feed_data(line[len("data:"):].strip())

    def feed_data(self, payload: str) -> None:
        """The payload of one `data:` field."""
        now_ns = self._clock_ns()
        if self.is_closed:
            return
        if payload == DONE_DATA:
            self._done_ns = now_ns
            self.status = StreamStatus.DONE
            return
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):   # also: nested past the stack, 4,300+ digits
            self.fail("invalid_response", f"not JSON: {payload[:200]!r}")
            return
        if not isinstance(event, dict):
            self.fail("invalid_response", f"not a JSON object: {payload[:200]!r}")
        elif event.get("error"):
            self.fail("stream_error", _shown(event["error"], payload))
        elif event.get("type") in self._endpoint.failed_events:
            self.fail("stream_error", _shown(event, payload))
        else:
            self._take_event(event, now_ns)

    def _take_event(self, event: dict, now_ns: int) -> None:
        self._take_usage(event)
        fmt = self._endpoint.stream_format
        kind = RULES[fmt](event)
        if kind is not None and kind != NEITHER and self._first_output is None:
            self._first_output = (now_ns, KIND_NAMES[kind])
        if kind == CONTENT:
            self._content_ns.append(now_ns)
            self.status = StreamStatus.STREAMING
        self._num_tool_calls += sum(m[0] == START for m in self._tools.feed(fmt, event))
        if self._endpoint.end_event is not None and event.get("type") == self._endpoint.end_event:
            self._done_ns = now_ns
            self.status = StreamStatus.DONE

    def _take_usage(self, event: dict) -> None:
        """Token counts: OpenAI's `usage` (prompt/completion_tokens); Anthropic's
        message_start.message.usage.input_tokens and message_delta.usage.output_tokens; the
        Responses API's response.completed.response.usage (input/output_tokens)."""
        holders = (event, event.get("message"), event.get("response"))
        for usage in (h.get("usage") for h in holders if isinstance(h, dict)):
            if isinstance(usage, dict):
                self._prompt_tokens = usage.get("prompt_tokens",
                                                usage.get("input_tokens", self._prompt_tokens))
                self._completion_tokens = usage.get(
                    "completion_tokens", usage.get("output_tokens", self._completion_tokens))

    def fail(self, kind: str, message: str = "", status_code: int | None = None) -> None:
        """Record the first failure; later ones (e.g. the broken stream after it) are ignored."""
        if self.status is not StreamStatus.FAILED:
            self._error = (kind, message, status_code)
            self.status = StreamStatus.FAILED

    def finish(self) -> RequestResult:
        """The result; a stream that ended without [DONE] (or its API's end event) or without
        any text has failed."""
        if self.status in (StreamStatus.CREATED, StreamStatus.WAITING, StreamStatus.STREAMING):
            end = self._endpoint.end_event
            self.fail("broken_stream", "stream ended without "
                      + ("data: [DONE]" if end is None else f"its {end} event"))
        elif self.status is StreamStatus.DONE and not self._content_ns and not self._num_tool_calls:
            self.fail("empty_response", "no event carried any text or tool call")
        kind, message, status_code = self._error or (None, "", None)
        first_ns, first_kind = self._first_output or (None, None)
        return RequestResult(
            index=self.index, sent_ns=self._sent_ns, finished_ns=self._clock_ns(),
            content_ns=tuple(self._content_ns), done_ns=self._done_ns,
            prompt_tokens=self._prompt_tokens, completion_tokens=self._completion_tokens,
            error_kind=kind, error_message=message, status_code=status_code,
            first_output_ns=first_ns, first_output_kind=first_kind,
            num_tool_calls=self._num_tool_calls,
        )


def _shown(obj: object, payload: str) -> str:
    """An error event's JSON, cut for the result; its raw text when it will not re-encode
    (an object parsed near the stack's limit can be too deep to encode again here)."""
    try:
        return json.dumps(obj)[:500]
    except (ValueError, RecursionError):
        return payload[:500]
