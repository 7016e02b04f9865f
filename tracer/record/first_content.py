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

Other stream formats have a rule each (`RULES`, the same as the probe's RULES in
frontend_probe/probe.js and formats.js; tests/fixtures/sse/formats/ checks both): OpenAI
Responses, Anthropic Messages, the AI SDK UI message stream, Ollama's NDJSON, Gemini. A rule
returns CONTENT for an event with answer text, TOOL_CALL for one that names a tool call's
function (its first delta: docs/architecture.md, "First output, by kind"), REASONING for one
with reasoning text only, NEITHER for one of its own events without any (role, start, ping,
usage, metadata, a tool call's argument fragments) and None for another format's event.
CONTENT ends TTFT; the first of any kind ends the stages. When tool calls are ready:
`tracer.record.tool_calls`.
`tracer.record.content_stream` reads a whole byte stream with them.

Standard library only, and no imports from other tracer packages: everything may use it.
"""
from __future__ import annotations

__all__ = ["CONTENT", "FORMATS", "KIND_NAMES", "NEITHER", "REASONING", "RULES", "TOOL_CALL",
           "classify", "is_content_event", "is_timing_token"]

NEITHER, CONTENT, REASONING, TOOL_CALL = 0, 1, 2, 3
# The output kind of each (tracer/record/stages.py, OUTPUT_KINDS).
KIND_NAMES = {CONTENT: "text", REASONING: "reasoning", TOOL_CALL: "tool_call"}


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


# --- one rule per stream format ------------------------------------------------------------

def _kind(text: object, reasoning: object = None) -> int:
    return CONTENT if _non_empty(text) else REASONING if _non_empty(reasoning) else NEITHER


def _best(kinds) -> int:
    """CONTENT if any item has content, else TOOL_CALL if any starts a call, else REASONING
    if any has reasoning, else NEITHER."""
    best = NEITHER
    for kind in kinds:
        if kind == CONTENT:
            return CONTENT
        best = max(best, kind)
    return best


def _get(obj: object, key: str) -> object:
    return obj.get(key) if isinstance(obj, dict) else None


def _items(value: object) -> list:
    return [x if isinstance(x, dict) else {} for x in value] if isinstance(value, list) else []


def _names_a_call(calls: object) -> bool:
    """Whether a list of OpenAI-style tool calls names a function (`function.name`)."""
    return isinstance(calls, list) and any(
        _non_empty(_get(_get(call, "function"), "name")) for call in calls)


def _openai(event: object) -> int | None:
    """Chat/completions chunks and bodies (the rule of `is_content_event`); `reasoning_content`
    (vLLM, DeepSeek) and `reasoning` (OpenRouter, Ollama's /v1) are reasoning; a `tool_calls`
    item or a legacy `function_call` with a `name` starts a tool call."""
    if not isinstance(_get(event, "choices"), list):
        return None
    def choice(c: dict) -> int:
        delta = _get(c, "delta")
        message = _get(c, "message")
        if any(_non_empty(v) for v in (c.get("text"), _get(delta, "content"),
                                      _get(message, "content"))):
            return CONTENT
        if (_names_a_call(_get(delta, "tool_calls")) or _names_a_call(_get(message, "tool_calls"))
                or _non_empty(_get(_get(delta, "function_call"), "name"))):
            return TOOL_CALL
        return REASONING if any(_non_empty(_get(delta, k))
                                for k in ("reasoning_content", "reasoning")) else NEITHER
    return _best(choice(c) for c in _items(event["choices"]))


def _gemini(event: object) -> int | None:
    """streamGenerateContent?alt=sse: `candidates[].content.parts[].text`; a part with
    `thought: true` is a thought summary (the Gemini API's Part: google's go-genai types.go,
    `Thought bool json:"thought"`)."""
    if not isinstance(_get(event, "candidates"), list):
        return None
    def part(p: dict) -> int:
        if _non_empty(_get(p.get("functionCall"), "name")):
            return TOOL_CALL
        return _kind(None, p.get("text")) if p.get("thought") is True else _kind(p.get("text"))
    return _best(_best(part(p) for p in _items(_get(_get(c, "content"), "parts")))
                 for c in _items(event["candidates"]))


def _ollama(event: object) -> int | None:
    """Ollama NDJSON: /api/chat `{"message": {"content"}, "done"}`, /api/generate `{"response",
    "done"}` (ollama api/types.go, ChatResponse, GenerateResponse); thinking models add
    `thinking` next to content / response."""
    if not isinstance(_get(event, "done"), bool):
        return None
    message = event.get("message")
    if isinstance(message, (dict, list)):
        kind = _kind(_get(message, "content"), _get(message, "thinking"))
        return TOOL_CALL if kind != CONTENT and _names_a_call(_get(message, "tool_calls")) else kind
    return _kind(event.get("response"), event.get("thinking"))


def _responses(event: object) -> int | None:
    """OpenAI Responses: `response.output_text.delta`; `response.reasoning_text.delta` and
    `response.reasoning_summary_text.delta` are reasoning (openai 7.59.0
    resources/responses/responses.d.ts, ResponseStreamEvent)."""
    kind = _get(event, "type")
    if not isinstance(kind, str) or not kind.startswith("response."):
        return None
    if kind == "response.output_text.delta":
        return _kind(event.get("delta"))
    if kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
        return _kind(None, event.get("delta"))
    item = event.get("item")
    if (kind == "response.output_item.added" and _get(item, "type") == "function_call"
            and _non_empty(_get(item, "name"))):
        return TOOL_CALL
    return NEITHER


def _anthropic(event: object) -> int | None:
    """Anthropic Messages: `content_block_delta` with `text_delta` (text) or `thinking_delta`
    (thinking); a `content_block_start` of a `tool_use` block starts a tool call; message_start,
    other block starts, ping, message_delta (usage), message_stop, input_json_delta are neither (@anthropic-ai/sdk 1.10.0 resources/messages/messages.d.ts)."""
    kind = _get(event, "type")
    if not isinstance(kind, str) or not (kind.startswith(("message_", "content_block_"))
                                         or kind == "ping"):
        return None
    block = event.get("content_block")
    if (kind == "content_block_start" and _get(block, "type") == "tool_use"
            and _non_empty(_get(block, "name"))):
        return TOOL_CALL
    if kind != "content_block_delta":
        return NEITHER
    delta = event.get("delta")
    sort = _get(delta, "type")
    return _kind(_get(delta, "text") if sort == "text_delta" else None,
                 _get(delta, "thinking") if sort == "thinking_delta" else None)


_BASE64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def is_timing_token(value: object) -> bool:
    """The in-band timing token's shape (tracer/web/inband.py): `<base64url payload>.<base64url
    HMAC-SHA256>`, 1 to 2000 and 43 characters (the probe's TIMING_COMMENT).

    >>> is_timing_token("eyJ2IjoxfQ." + "A" * 43), is_timing_token("a.b")
    (True, False)
    """
    if not isinstance(value, str):
        return False
    payload, dot, sig = value.partition(".")
    return (bool(dot) and 1 <= len(payload) <= 2000 and len(sig) == 43
            and _BASE64URL.issuperset(payload) and _BASE64URL.issuperset(sig))


def _ai_sdk_ui(event: object) -> int | str | None:
    """AI SDK UI message stream (`x-vercel-ai-ui-message-stream: v1`): `text-delta`,
    `reasoning-delta`, `tool-input-start` (a tool call); start, text-start, start-step, the
    other tool-input-* parts, data-*, message-metadata,
    finish are neither (ai 7.0.173 dist/index.js, uiMessageChunkSchema). The
    `data-ttft-timing` part (frontend_probe/server.js) returns the engine's timing token."""
    kind = _get(event, "type")
    if not isinstance(kind, str) or not (kind in ("start", "finish", "abort") or "-" in kind):
        return None
    if kind == "text-delta":
        return _kind(event.get("delta"))
    if kind == "reasoning-delta":
        return _kind(None, event.get("delta"))
    if kind == "tool-input-start" and _non_empty(event.get("toolName")):
        return TOOL_CALL
    data = event.get("data")
    if kind == "data-ttft-timing" and is_timing_token(data):
        return data
    return NEITHER


# Tried in this order until one recognises an event's shape (the probe's order).
RULES: dict[str, object] = {
    "openai": _openai, "gemini": _gemini, "ollama": _ollama, "openai-responses": _responses,
    "anthropic": _anthropic, "ai-sdk-ui": _ai_sdk_ui,
}
# The closed set of formats (the probe beacon's `format`): the rules, a plain-text stream
# (its first non-empty decoded text is the first token) and the probe's isContent hook.
FORMATS: tuple[str, ...] = (*RULES, "text", "custom")


def classify(event: object, fmt: str | None = None) -> tuple[str | None, int | str | None]:
    """(format, kind) of one parsed event: by `fmt`'s rule when the stream's format is known,
    else by the first rule that recognises the shape (format None when none does).

    >>> classify({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}})
    ('anthropic', 1)
    >>> classify({"choices": [{"delta": {"content": "Hi"}}]}, "anthropic")
    ('anthropic', None)
    >>> classify({"type": "reasoning-delta", "id": "r", "delta": "hm"})
    ('ai-sdk-ui', 2)
    >>> classify({"text": "x"})
    (None, None)
    """
    if fmt is not None:
        rule = RULES.get(fmt)
        return fmt, None if rule is None else rule(event)
    for name, rule in RULES.items():
        kind = rule(event)
        if kind is not None:
            return name, kind
    return None, None
