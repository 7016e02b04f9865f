"""When each tool call of a streamed answer starts and when its arguments are complete.

A call starts at its first event that names the function (what `first_content`'s rules call
TOOL_CALL), and is ready when its arguments are complete: the moment an agent can run the
tool. One rule per stream format, the same as the browser probe's (frontend_probe/
formats.js, `toolCalls`; tests/fixtures/sse/formats/ checks both):

- OpenAI chat: `choices[].delta.tool_calls[]` by `index` (the legacy `delta.function_call`
  is one call); a call is ready when the choice moves on: its next call starts, text or
  reasoning follows, or its `finish_reason` comes. A non-streamed `message.tool_calls` is started and ready at once.
- Responses: `response.output_item.added` of a `function_call` item starts it (by
  `output_index`); `response.function_call_arguments.done` or the item's
  `response.output_item.done` makes it ready.
- Anthropic: `content_block_start` of a `tool_use` block starts it (by `index`);
  `content_block_stop` of that index makes it ready.
- AI SDK UI stream: `tool-input-start` (by `toolCallId`); `tool-input-available` or
  `tool-input-error`.
- Ollama (`message.tool_calls`) and Gemini (`functionCall` parts) send each call whole:
  started and ready in the same event.

A call still open when the stream ends has no ready time: its arguments never completed.
Hostile streams cost bounded memory: keys are ints or short strings, at most
MAX_TRACKED calls are remembered (more are still reported as they start), and a name that is
not a string is no name.

Standard library only; of tracer, it imports nothing.
"""
from __future__ import annotations

__all__ = ["MAX_TRACKED", "START", "READY", "ToolCallTracker"]

START, READY = "start", "ready"
MAX_TRACKED = 1024
_MAX_KEY_CHARS = 128


def _get(obj: object, key: str) -> object:
    return obj.get(key) if isinstance(obj, dict) else None


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _name(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _key(value: object) -> object:
    """An id usable as a key: an int or a short string; anything else is no key."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and 0 < len(value) <= _MAX_KEY_CHARS):
        return value
    return None


class ToolCallTracker:
    """Feed it each parsed event of one stream, with the stream's format; it returns the
    tool-call moments the event completes: `(START, key, name)` and `(READY, key, None)`.

    >>> t = ToolCallTracker()
    >>> t.feed("openai", {"choices": [{"index": 0, "delta": {"tool_calls": [
    ...     {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": ""}}]}}]})
    [('start', (0, 0), 'get_weather')]
    >>> t.feed("openai", {"choices": [{"index": 0, "delta": {"tool_calls": [
    ...     {"index": 0, "function": {"arguments": "{}"}}]}}]})
    []
    >>> t.feed("openai", {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    [('ready', (0, 0), None)]
    """

    __slots__ = ("_open", "_seen", "_counter")

    def __init__(self) -> None:
        self._open: dict[object, None] = {}   # started, not ready (insertion-ordered)
        self._seen: set[object] = set()       # every key started (bounded)
        self._counter = 0                     # keys of formats that send calls whole

    def feed(self, fmt: str | None, event: object) -> list[tuple[str, object, str | None]]:
        rule = _RULES.get(fmt)
        if rule is None or not isinstance(event, dict):
            return []
        out: list[tuple[str, object, str | None]] = []
        rule(self, event, out)
        return out

    @property
    def num_open(self) -> int:
        """Calls started whose arguments are not complete yet."""
        return len(self._open)

    def open_keys(self) -> list[object]:
        """Calls started and not ready: at the stream's end, their arguments never completed."""
        return list(self._open)

    # -- the moments ----------------------------------------------------------------------

    def _start(self, out: list, key: object, name: object, *, whole: bool = False) -> None:
        if key is None or key in self._seen:
            return
        if len(self._seen) < MAX_TRACKED:
            self._seen.add(key)
            if not whole:
                self._open[key] = None
        out.append((START, key, _name(name)))
        if whole:
            out.append((READY, key, None))

    def _ready(self, out: list, key: object) -> None:
        if key in self._open:
            del self._open[key]
            out.append((READY, key, None))

    def _whole_key(self) -> int:
        self._counter += 1
        return self._counter - 1

    # -- one rule per format --------------------------------------------------------------

    def _openai(self, event: dict, out: list) -> None:
        for position, choice in enumerate(_list(event.get("choices"))):
            if not isinstance(choice, dict):
                continue
            c = _key(choice.get("index"))
            c = position if c is None else c
            message = choice.get("message")
            if isinstance(message, dict):          # a non-streamed answer: each call whole
                for i, call in enumerate(_list(message.get("tool_calls"))):
                    if _name(_get(_get(call, "function"), "name")):
                        self._start(out, (c, i), _get(_get(call, "function"), "name"),
                                    whole=True)
                continue
            delta = choice.get("delta")
            calls = [(_key(_get(call, "index")), _get(_get(call, "function"), "name"))
                     for call in _list(_get(delta, "tool_calls"))]
            legacy = _get(delta, "function_call")
            if isinstance(legacy, dict):
                calls.append(("function_call", legacy.get("name")))
            if any(isinstance(_get(delta, k), str) and _get(delta, k)
                   for k in ("content", "reasoning_content", "reasoning")):
                for key in [k for k in self._open if k[0] == c]:
                    self._ready(out, key)          # text after a call: the call is complete
            for index, name in calls:
                if index is not None and _name(name) and (c, index) not in self._seen:
                    for key in [k for k in self._open if k[0] == c]:
                        self._ready(out, key)      # the choice's previous call is complete
                    self._start(out, (c, index), name)
            if choice.get("finish_reason") is not None:
                for key in [k for k in self._open if k[0] == c]:
                    self._ready(out, key)

    def _responses(self, event: dict, out: list) -> None:
        kind, item = event.get("type"), event.get("item")
        index = _key(event.get("output_index"))
        if kind == "response.output_item.added" and _get(item, "type") == "function_call":
            if _name(_get(item, "name")):
                self._start(out, index, item["name"])
        elif kind == "response.function_call_arguments.done" or (
                kind == "response.output_item.done" and _get(item, "type") == "function_call"):
            self._ready(out, index)

    def _anthropic(self, event: dict, out: list) -> None:
        kind, index = event.get("type"), _key(event.get("index"))
        block = event.get("content_block")
        if kind == "content_block_start" and _get(block, "type") == "tool_use":
            if _name(_get(block, "name")):
                self._start(out, index, block["name"])
        elif kind == "content_block_stop":
            self._ready(out, index)

    def _ai_sdk_ui(self, event: dict, out: list) -> None:
        kind, key = event.get("type"), _key(event.get("toolCallId"))
        if kind == "tool-input-start" and _name(event.get("toolName")):
            self._start(out, key, event["toolName"])
        elif kind in ("tool-input-available", "tool-input-error"):
            self._ready(out, key)

    def _ollama(self, event: dict, out: list) -> None:
        for call in _list(_get(event.get("message"), "tool_calls")):
            name = _get(_get(call, "function"), "name")
            if _name(name):
                self._start(out, self._whole_key(), name, whole=True)

    def _gemini(self, event: dict, out: list) -> None:
        for candidate in _list(event.get("candidates")):
            for part in _list(_get(_get(candidate, "content"), "parts")):
                name = _get(_get(part, "functionCall"), "name")
                if _name(name):
                    self._start(out, self._whole_key(), name, whole=True)


_RULES = {"openai": ToolCallTracker._openai, "openai-responses": ToolCallTracker._responses,
          "anthropic": ToolCallTracker._anthropic, "ai-sdk-ui": ToolCallTracker._ai_sdk_ui,
          "ollama": ToolCallTracker._ollama, "gemini": ToolCallTracker._gemini}
