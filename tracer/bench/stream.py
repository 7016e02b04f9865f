"""Reads one OpenAI-style SSE stream and timestamps it the way benchmark clients do.

A content event is one where any choice has a non-empty `delta.content`, `text` or
`message.content` (`tracer.record.first_content.is_content_event`, the rule the proxy and the
browser probe share). Role-only, finish-only and usage-only (`choices: []`) events are not
tokens: a server that sends `{"role": "assistant", "content": ""}` first must not make TTFT
read near zero (vLLM #15106; docs/reference.md, "How benchmark clients define the numbers").
"""
from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable

from tracer.bench.stats import RequestResult
from tracer.record.first_content import is_content_event

DONE_SENTINEL = "[DONE]"


class StreamStatus(enum.Enum):
    CREATED = "created"      # not sent yet
    WAITING = "waiting"      # sent, no content yet
    STREAMING = "streaming"  # at least one content event
    DONE = "done"            # `data: [DONE]` seen
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
        # Only validated: one content rule covers chat (`delta.content`) and completions (`text`).
        if endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}")
        self.index = index
        self.status = StreamStatus.CREATED
        self._clock_ns = clock_ns
        self._sent_ns = 0
        self._content_ns: list[int] = []
        self._done_ns: int | None = None
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
        if payload == DONE_SENTINEL:
            self._done_ns = now_ns
            self.status = StreamStatus.DONE
            return
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            self.fail("invalid_response", f"not JSON: {payload[:200]!r}")
            return
        if not isinstance(event, dict):
            self.fail("invalid_response", f"not a JSON object: {payload[:200]!r}")
        elif event.get("error"):
            self.fail("stream_error", json.dumps(event["error"])[:500])
        else:
            self._take_event(event, now_ns)

    def _take_event(self, event: dict, now_ns: int) -> None:
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._prompt_tokens = usage.get("prompt_tokens", self._prompt_tokens)
            self._completion_tokens = usage.get("completion_tokens", self._completion_tokens)
        if is_content_event(event):
            self._content_ns.append(now_ns)
            self.status = StreamStatus.STREAMING

    def fail(self, kind: str, message: str = "", status_code: int | None = None) -> None:
        """Record the first failure; later ones (e.g. the broken stream after it) are ignored."""
        if self.status is not StreamStatus.FAILED:
            self._error = (kind, message, status_code)
            self.status = StreamStatus.FAILED

    def finish(self) -> RequestResult:
        """The result; a stream that ended without [DONE] or without any text has failed."""
        if self.status in (StreamStatus.CREATED, StreamStatus.WAITING, StreamStatus.STREAMING):
            self.fail("broken_stream", "stream ended without data: [DONE]")
        elif self.status is StreamStatus.DONE and not self._content_ns:
            self.fail("empty_response", "no event carried any text")
        kind, message, status_code = self._error or (None, "", None)
        return RequestResult(
            index=self.index, sent_ns=self._sent_ns, finished_ns=self._clock_ns(),
            content_ns=tuple(self._content_ns), done_ns=self._done_ns,
            prompt_tokens=self._prompt_tokens, completion_tokens=self._completion_tokens,
            error_kind=kind, error_message=message, status_code=status_code,
        )
