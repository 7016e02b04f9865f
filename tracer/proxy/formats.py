"""The relayed APIs whose streams are not OpenAI chat/completions chunks: Anthropic Messages
(`/v1/messages`, which vLLM and SGLang serve too) and the OpenAI Responses API
(`/v1/responses`). The route says which format a request's answer is in, once per request;
`FormatScanner` then reads that answer's events by the format's own rule
(`tracer.record.first_content.RULES`), so the OpenAI scanner's fast path (tracer/proxy/sse.py)
is untouched and these streams never pay for it.

What each format's events say about the whole response, mapped to the chat path's summary
(finish reason, usage, in-band error, end of stream):

- Messages (@anthropic-ai/sdk 1.10.0 resources/messages/messages.d.ts, RawMessageStreamEvent):
  the stream ends at `message_stop`; `message_delta.delta.stop_reason` `end_turn` and
  `stop_sequence` → `stop`, `max_tokens` → `length`, `tool_use` → `tool_calls`, any other
  value as is; an `error` event is an in-band upstream error. Usage: `message_start`'s
  `input_tokens` (+ `cache_read_input_tokens`, which are the cached ones, +
  `cache_creation_input_tokens`), `message_delta`'s cumulative `output_tokens`.
- Responses (openai 7.59.0 resources/responses/responses.d.ts, ResponseStreamEvent): the
  stream ends at `response.completed` (→ `stop`), `response.incomplete` (its
  `incomplete_details.reason`: `max_output_tokens` → `length`, any other as is) or
  `response.failed` (an upstream error, as is an `error` event). Usage from the final
  response's `input_tokens`, `input_tokens_details.cached_tokens` and `output_tokens`.
"""
from __future__ import annotations

import json

from tracer.proxy.sse import SSEScanner, _data_of
from tracer.proxy.stream_summary import StreamSummary
from tracer.record.first_content import CONTENT, RULES
from tracer.record.sse_vocabulary import (
    ANTHROPIC_END_EVENT,
    ERROR_EVENT,
    RESPONSES_END_EVENTS,
    RESPONSES_FAILED,
)
from tracer.record.tool_calls import READY, START

__all__ = ["FORMAT_OF_PATH", "OPERATION_OF_PATH", "FormatScanner", "set_usage",
           "summarize_format_body"]

# The relayed path → its stream format (a key of tracer.record.first_content.RULES); a path
# not listed is OpenAI chat/completions. Ollama's native API streams NDJSON, not SSE
# (tracer/proxy/ollama_stream.py).
FORMAT_OF_PATH = {"/v1/messages": "anthropic", "/v1/responses": "openai-responses",
                  "/api/chat": "ollama", "/api/generate": "ollama"}
# The span's operation of a path in FORMAT_OF_PATH when it is not "chat".
OPERATION_OF_PATH = {"/api/generate": "text_completion"}

_ANTHROPIC_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                   "tool_use": "tool_calls"}
_RESPONSES_INCOMPLETE = {"max_output_tokens": "length"}


def _int(value) -> int | None:
    return value if type(value) is int else None


def set_usage(summary: StreamSummary, *, prompt: int | None = None,
               cached: int | None = None, output: int | None = None) -> None:
    """Keep the counts in the chat path's `usage` shape, which `token_counts` reads."""
    usage = summary.usage if summary.usage is not None else {}
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if output is not None:
        usage["completion_tokens"] = output
    summary.usage = usage


def _anthropic_usage(summary: StreamSummary, usage) -> None:
    if not isinstance(usage, dict):
        return
    read = _int(usage.get("cache_read_input_tokens"))
    fresh = _int(usage.get("input_tokens"))
    prompt = None
    if fresh is not None:
        prompt = fresh + (read or 0) + (_int(usage.get("cache_creation_input_tokens")) or 0)
    set_usage(summary, prompt=prompt, cached=read if prompt is not None else None,
               output=_int(usage.get("output_tokens")))


def _absorb_anthropic(summary: StreamSummary, obj: dict) -> None:
    kind = obj.get("type")
    if kind == "message_start" and isinstance(obj.get("message"), dict):
        _anthropic_usage(summary, obj["message"].get("usage"))
    elif kind == "message_delta":
        delta = obj.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if isinstance(reason, str):
            summary.finish_reason = _ANTHROPIC_STOP.get(reason, reason)
        _anthropic_usage(summary, obj.get("usage"))
    elif kind == ANTHROPIC_END_EVENT:
        summary.done = True
    elif kind == ERROR_EVENT:
        summary.error = obj["error"] if isinstance(obj.get("error"), dict) else {"type": "error"}
    elif kind == "message":   # a non-streamed answer
        if isinstance(obj.get("stop_reason"), str):
            summary.finish_reason = _ANTHROPIC_STOP.get(obj["stop_reason"], obj["stop_reason"])
        _anthropic_usage(summary, obj.get("usage"))


def _absorb_response(summary: StreamSummary, response: dict) -> None:
    """The final (or non-streamed) Response object: its status, usage and error."""
    status = response.get("status")
    if status == "completed":
        summary.finish_reason = "stop"
    elif status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        summary.finish_reason = (_RESPONSES_INCOMPLETE.get(reason, reason)
                                 if isinstance(reason, str) else "incomplete")
    elif status == "failed":
        error = response.get("error")
        summary.error = error if isinstance(error, dict) else {"type": "response.failed"}
    if isinstance(response.get("metrics"), dict):   # vLLM --enable-per-request-metrics
        summary.metrics = response["metrics"]
    usage = response.get("usage")
    if isinstance(usage, dict):
        details = usage.get("input_tokens_details")
        set_usage(summary, prompt=_int(usage.get("input_tokens")),
                   cached=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
                   output=_int(usage.get("output_tokens")))
        out = usage.get("output_tokens_details")
        if isinstance(out, dict) and _int(out.get("reasoning_tokens")) is not None:
            summary.usage["completion_tokens_details"] = {"reasoning_tokens": out["reasoning_tokens"]}


def _absorb_responses(summary: StreamSummary, obj: dict) -> None:
    kind = obj.get("type")
    if not isinstance(kind, str):   # a `type` of another JSON type (a dict is unhashable)
        kind = None
    if kind in RESPONSES_END_EVENTS:
        summary.done = True
        if isinstance(obj.get("response"), dict):
            _absorb_response(summary, obj["response"])
        if kind == RESPONSES_FAILED and summary.error is None:
            summary.error = {"type": kind}
    elif kind == ERROR_EVENT:
        summary.error = {k: obj[k] for k in ("code", "message") if k in obj} or {"type": kind}
    elif obj.get("object") == "response":   # a non-streamed answer
        _absorb_response(summary, obj)


_ABSORB = {"anthropic": _absorb_anthropic, "openai-responses": _absorb_responses}


class FormatScanner(SSEScanner):
    """The SSE scanner for one non-OpenAI format: every event is parsed and judged by that
    format's rule (these APIs have no OpenAI-sized event rate to save on).

    >>> s = FormatScanner("anthropic")
    >>> s.feed(b'event: ping\\ndata: {"type":"ping"}\\n\\n')
    0
    >>> s.feed(b'data: {"type":"content_block_delta",'
    ...        b'"delta":{"type":"text_delta","text":"Hi"}}\\n\\n')
    1
    >>> s.feed(b'data: {"type":"message_stop"}\\n\\n'), s.summary.done
    (0, True)
    """

    __slots__ = ("_rule", "_absorb", "_format")

    def __init__(self, fmt: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rule = RULES[fmt]
        self._absorb = _ABSORB[fmt]
        self._format = fmt

    def _event(self, event: bytes) -> int:
        data = _data_of(event)
        if data is None:
            return 0
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):   # RecursionError: nested past the stack
            return 0   # an event we cannot read is not content; the relay goes on
        if not isinstance(obj, dict):
            return 0
        self._absorb(self.summary, obj)
        if self._outputs(obj, self._rule(obj)) == CONTENT:
            self.summary.num_content_events += 1
            return 1
        return 0


def _whole_has_text(fmt: str, obj: dict) -> bool:
    """Whether a non-streamed answer carries answer text: a Messages `content[]` text block,
    a Responses `output[]` message's `output_text` part."""
    if fmt == "anthropic":
        return _has_text_part(obj.get("content"), "text")
    items = obj.get("output")
    return any(isinstance(item, dict) and _has_text_part(item.get("content"), "output_text")
               for item in (items if isinstance(items, list) else ()))


def _has_text_part(parts, part_type: str) -> bool:
    return isinstance(parts, list) and any(
        isinstance(p, dict) and p.get("type") == part_type and isinstance(p.get("text"), str)
        and p["text"] != "" for p in parts)


def _whole_tool_calls(fmt: str, obj: dict) -> list[tuple[str, object, object]]:
    """A non-streamed answer's tool calls, each started and ready at once: a Messages
    `tool_use` block, a Responses `function_call` output item."""
    key, part_type = ("content", "tool_use") if fmt == "anthropic" else ("output", "function_call")
    parts = obj.get(key)
    moments: list[tuple[str, object, object]] = []
    for i, part in enumerate(parts if isinstance(parts, list) else ()):
        name = part.get("name") if isinstance(part, dict) and part.get("type") == part_type else None
        if isinstance(name, str) and name:
            moments += [(START, i, name), (READY, i, None)]
    return moments


def summarize_format_body(body: bytes, fmt: str) -> tuple[StreamSummary, bool, list]:
    """(summary, has content, tool-call moments) of a non-streamed answer in `fmt`."""
    summary = StreamSummary()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):   # RecursionError: nested past the stack
        return summary, False, []
    if not isinstance(obj, dict):
        return summary, False, []
    _ABSORB[fmt](summary, obj)
    has_content = _whole_has_text(fmt, obj)
    summary.num_content_events = int(has_content)
    return summary, has_content, _whole_tool_calls(fmt, obj)
