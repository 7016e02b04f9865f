"""The one rule for "this SSE event carries content": TTFT ends at the first such event.

Time to first token is measured to the first event that carries text the user sees, not to
the first event of the stream. Servers often open a chat stream with a role-only chunk
(`{"delta": {"role": "assistant"}}` or `{"role": "assistant", "content": ""}`): vLLM does, and
llama-cpp-python sends a role-only delta right before the first content. A client that stops
its TTFT clock at that chunk reads TTFT falsely low, close to the network round trip, however
long the prefill took. Likewise a usage-only chunk (`"choices": []`), a finish-only chunk or an
in-band error event is not a token.

The proxy's SSE scanner (tracer/proxy/sse.py), the load generator (tracer/bench/stream.py)
and the browser probe (frontend_probe/probe.js, `hasContent`) all apply this same rule; the
recorded streams in tests/fixtures/sse/ check that they agree.

Standard library only, and no imports from other tracer packages: everything may use it.
"""
from __future__ import annotations

__all__ = ["is_content_event"]


def is_content_event(event: object) -> bool:
    """Whether one parsed event (the decoded JSON of a `data:` payload) carries content.

    True when `event` is a dict whose `choices` is a list and ANY choice (a dict) carries a
    non-empty string in `delta.content` (a chat chunk), `text` (a completions chunk) or
    `message.content` (a non-streamed chat body). With `n > 1` the first content may come in
    any choice, not only in `choices[0]`.

    Not content: role-only chunks, empty or `null` content, usage-only chunks
    (`"choices": []`), finish-only chunks, error events, anything that is not a dict, and
    `reasoning_content`: what the user sees first is the answer, so a reasoning model's
    thinking does not end TTFT.

    >>> is_content_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    False
    >>> is_content_event({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    True
    >>> is_content_event({"choices": [{"index": 0, "delta": {}},
    ...                               {"index": 1, "delta": {"content": "Hi"}}]})
    True
    >>> is_content_event({"choices": [{"index": 0, "delta": {"reasoning_content": "Hmm"}}]})
    False
    >>> is_content_event({"choices": [], "usage": {"completion_tokens": 3}})
    False
    >>> [is_content_event(e) for e in ({"choices": [{"text": " Paris"}]}, None, "text", [])]
    [True, False, False, False]
    """
    if not isinstance(event, dict):
        return False
    choices = event.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if _non_empty(choice.get("text")):
            return True
        for holder in (choice.get("delta"), choice.get("message")):
            if isinstance(holder, dict) and _non_empty(holder.get("content")):
                return True
    return False


def _non_empty(value: object) -> bool:
    return isinstance(value, str) and value != ""
