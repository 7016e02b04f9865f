"""What an upstream said about its whole answer, filled as its events pass or read from a
whole JSON body: the finish reason, the usage, llama.cpp's `timings`, vLLM's `metrics`, an
in-band error, the end; the token counts the record takes from it, and the span attributes
its response head gives (`upstream_attributes`).

The scanners (tracer/proxy/sse.py, formats.py, ollama_stream.py) fill one `StreamSummary`
per relayed stream; `summarize_body` reads an answer sent whole.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracer.record.first_content import is_content_event
from tracer.record.token_counts import MAX_TOKENS_PER_REQUEST, REASONING_TOKENS_ATTR
from tracer.record.tool_calls import ToolCallTracker
from tracer.record.traceparent import parse_server_timing

if TYPE_CHECKING:
    from tracer.proxy.http1 import ResponseHead


@dataclass(slots=True)
class StreamSummary:
    """What the upstream said about the whole response (filled as events pass).

    >>> token_counts(StreamSummary(num_content_events=3, timings={"prompt_n": 5, "cache_n": 2}))
    (7, 2, 3)
    """

    num_content_events: int = 0
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None         # llama.cpp server: on the last chunk
    metrics: dict | None = None         # vLLM --enable-per-request-metrics: on the usage chunk
    ollama_final: dict | None = None    # Ollama: the final line's durations and counts
    error: dict | None = None           # an in-band `{"error": ...}` event
    done: bool = False                  # `data: [DONE]` seen


def fill_summary(summary: StreamSummary, obj: object) -> None:
    """What a chunk or a whole response says of the answer: error, usage, timings, finish."""
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("error"), dict):
        summary.error = obj["error"]
    if isinstance(obj.get("usage"), dict):
        summary.usage = obj["usage"]
    if isinstance(obj.get("timings"), dict):
        summary.timings = obj["timings"]
    if isinstance(obj.get("metrics"), dict):
        summary.metrics = obj["metrics"]
    choices = obj.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
            summary.finish_reason = choice["finish_reason"]


def summarize_body(body: bytes) -> tuple[StreamSummary, bool, list]:
    """(summary, has content, tool calls as `ToolCallTracker` moments) of a non-streamed JSON
    response body."""
    summary = StreamSummary()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):   # RecursionError: nested past the stack
        return summary, False, []
    fill_summary(summary, obj)
    has_content = is_content_event(obj)
    summary.num_content_events = int(has_content)
    return summary, has_content, ToolCallTracker().feed("openai", obj)


def reasoning_tokens(summary: StreamSummary) -> int | None:
    """The answer's reasoning tokens where its usage says (`completion_tokens_details.
    reasoning_tokens`: OpenAI, vLLM; the Responses API's `output_tokens_details` is kept under
    the same key), within 0 … MAX_TOKENS_PER_REQUEST; None when it does not.

    >>> reasoning_tokens(StreamSummary(usage={"completion_tokens_details": {"reasoning_tokens": 7}}))
    7
    """
    details = (summary.usage or {}).get("completion_tokens_details")
    n = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return n if type(n) is int and 0 <= n <= MAX_TOKENS_PER_REQUEST else None


def token_counts(summary: StreamSummary) -> tuple[int, int, int]:
    """(prompt, cached, output) tokens from `usage`, else llama.cpp `timings`, else chunks."""
    prompt = cached = output = None
    usage = summary.usage or {}
    timings = summary.timings or {}
    if isinstance(usage.get("prompt_tokens"), int):
        prompt = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = details["cached_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        output = usage["completion_tokens"]
    if prompt is None and isinstance(timings.get("prompt_n"), int):
        # llama.cpp: prompt_n counts the evaluated tokens, cache_n the reused ones.
        cached = timings.get("cache_n") if isinstance(timings.get("cache_n"), int) else 0
        prompt = timings["prompt_n"] + cached
    if output is None and isinstance(timings.get("predicted_n"), int):
        output = timings["predicted_n"]
    if output is None:
        output = summary.num_content_events
    return prompt or 0, cached or 0, output


def upstream_attributes(head: ResponseHead, summary: StreamSummary) -> dict:
    """What the upstream said about itself (its response head, and its usage's reasoning
    tokens), for the request span."""
    attrs = {"llm.upstream.status_code": head.status}
    request_id = head.header(b"x-request-id")
    if request_id:
        attrs["llm.upstream.request_id"] = request_id[:128].decode("latin-1")
    server_timing = head.header(b"server-timing")
    upstream_parent = parse_server_timing(server_timing.decode("latin-1")
                                          if server_timing else None)
    if upstream_parent:
        attrs["llm.upstream.traceparent"] = upstream_parent
    reasoning = reasoning_tokens(summary)
    if reasoning is not None:   # docs/architecture.md, "First output, by kind"
        attrs[REASONING_TOKENS_ATTR] = reasoning
    return attrs
