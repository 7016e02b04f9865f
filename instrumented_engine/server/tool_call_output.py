"""A tool-call answer's output and its timeline, streamed or not.

Streamed, each `tool_calls` delta is timed once it was handed to the transport: a call starts
with the delta that names it, and is ready with the one that completes its arguments. Not
streamed, nothing is sent before the whole body, so every call starts when the first text was
ready and is ready when the body is built. Never an `emit`: inter-token latency is about text.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from instrumented_engine.engine.outputs import RequestOutput
from instrumented_engine.server.progress import Progress
from instrumented_engine.server.sse import ChunkFormatter
from instrumented_engine.server.tool_call_stream import ToolCall


def tool_call_events(calls, out: RequestOutput, fmt: ChunkFormatter, timeline,
                     progress: Progress, clock_ns: Callable[[], int]) -> Iterator[bytes]:
    """The `tool_calls` deltas of one output, each timed after its send (this generator
    resumes once the event was handed to the transport)."""
    for delta in calls.feed(out.text):
        first = not progress.sent_first
        if first:
            # A "required" call's first output comes after its first text; the engine
            # left `detokenize` open for this (recording.py): it ends now, when it exists.
            timeline.mark("detokenize", clock_ns())
            timeline.stage_attr("detokenize", "num_tokens", out.num_output_tokens)
        yield fmt.tool_call(delta.index, delta.arguments, first=first,
                            call_id=delta.call_id, name=delta.name)
        now_ns = clock_ns()
        if first:
            timeline.mark("send", now_ns)
            progress.sent_first = True
        if delta.name is not None:
            timeline.output("tool_call", now_ns)
            timeline.tool_call(delta.index, now_ns, name=delta.name)
        if delta.ready:
            timeline.tool_call_ready(delta.index, now_ns)


def time_collected_calls(timeline, calls: list[ToolCall], first_text_ns: int,
                         now_ns: int) -> None:
    """The calls of a body sent whole: each starts with the first text, and is ready now."""
    for i, call in enumerate(calls):
        timeline.tool_call(i, first_text_ns, name=call.name)
        if call.ready:
            timeline.tool_call_ready(i, now_ns)


def tool_calls_message(calls: list[ToolCall]) -> dict:
    """The assistant's message of a non-streamed answer that is tool calls.

    >>> tool_calls_message([ToolCall("call_1", "f", '{"a": 1}', True)])["tool_calls"][0]["function"]
    {'name': 'f', 'arguments': '{"a": 1}'}
    """
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.call_id, "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}
