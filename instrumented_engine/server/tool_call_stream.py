"""The constrained output, read as it streams, turned into OpenAI `tool_calls` deltas.

As vLLM streams these two choices (vllm/entrypoints/openai/serving_chat.py,
`chat_completion_stream_generator` and `extract_tool_call_required_streaming`, at commit
003fe5932dc9): a call's first delta carries its `index`, `id`, `type: "function"`,
`function.name` and `"arguments": ""`; the next ones carry `function.arguments` fragments
only. Unlike vLLM, which parses the partial JSON again on every token, the text is read
once, character by character: the grammar guarantees its shape, so a small scanner knows
where the name ends and which characters are the arguments.

- Named function: the whole output is the arguments. The call starts with the first text.
- "required": the output is `[{"name": "f", "parameters": {...}}, ...]`. A call starts when
  its name is complete; its arguments are the text of its `parameters` object.

A call's arguments are complete (`ready`) when their object closes: then an agent can run it.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass


@dataclass(slots=True)
class ToolCallDelta:
    """One `tool_calls[]` entry of a chunk. The first of a call has `call_id` and `name`."""

    index: int
    arguments: str
    call_id: str | None = None
    name: str | None = None
    ready: bool = False          # these arguments complete the call's


@dataclass(slots=True)
class ToolCall:
    """A call as read so far (the non-streamed answer is these, whole)."""

    call_id: str
    name: str
    arguments: str
    ready: bool


def new_call_id() -> str:
    # OpenAI's shape: "call_" and 24 characters.
    return "call_" + secrets.token_hex(12)


class _Depth:
    """Tracks JSON nesting outside strings, one character at a time."""

    __slots__ = ("depth", "in_string", "_escape")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self._escape = False

    def step(self, ch: str) -> None:
        if self.in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1


class NamedCallReader:
    """The output is the named function's arguments: one call, index 0.

    >>> r = NamedCallReader("get_weather")
    >>> [(d.name, d.arguments, d.ready) for d in r.feed('{"city": ')]
    [('get_weather', '', False), (None, '{"city": ', False)]
    >>> [(d.arguments, d.ready) for d in r.feed('"Paris"}')]
    [('"Paris"}', True)]
    """

    def __init__(self, name: str) -> None:
        self._call = ToolCall(new_call_id(), name, "", False)
        self._started = False
        self._json = _Depth()

    def feed(self, text: str) -> list[ToolCallDelta]:
        if not text or self._call.ready:
            return []
        deltas = []
        if not self._started:
            self._started = True
            deltas.append(ToolCallDelta(0, "", self._call.call_id, self._call.name))
        for ch in text:
            self._json.step(ch)
        self._call.arguments += text
        self._call.ready = self._json.depth == 0 and not self._json.in_string
        deltas.append(ToolCallDelta(0, text, ready=self._call.ready))
        return deltas

    @property
    def calls(self) -> list[ToolCall]:
        return [self._call] if self._started else []


class RequiredCallReader:
    """Reads `[{"name": ..., "parameters": {...}}, ...]` into calls, as it streams.

    >>> r = RequiredCallReader()
    >>> r.feed('[{"name": "get_')
    []
    >>> [(d.index, d.name, d.arguments) for d in r.feed('weather", "parameters": {"c')]
    [(0, 'get_weather', ''), (0, None, '{"c')]
    >>> [(d.index, d.name, d.arguments, d.ready) for d in r.feed('": 1}}, {"name": "f", ')]
    [(0, None, '": 1}', True), (1, 'f', '', False)]
    >>> [(c.name, c.arguments, c.ready) for c in r.calls]
    [('get_weather', '{"c": 1}', True), ('f', '', False)]
    """

    def __init__(self) -> None:
        self._json = _Depth()
        self.calls: list[ToolCall] = []
        self._key: str | None = None     # the call object's key being read or last read
        self._after_colon = False        # the call object's next string is a value
        self._string: list[str] | None = None   # a key or the name, while it is read
        self._name: str | None = None
        self._arguments: list[str] | None = None  # the arguments' text, while it is read
        self._pending = ""               # arguments read before the name (sent with it)

    def feed(self, text: str) -> list[ToolCallDelta]:
        deltas: list[ToolCallDelta] = []
        fragment: list[str] = []
        for ch in text:
            was_string, depth = self._json.in_string, self._json.depth
            self._json.step(ch)
            if self._arguments is not None:
                self._arguments.append(ch)
                fragment.append(ch)
                if self._json.depth == 2:          # the parameters object closed
                    self._flush(deltas, fragment, ready=True)
                continue
            if depth != 2:
                continue
            # Inside a call object, outside its arguments.
            if self._string is not None:
                if self._json.in_string:
                    self._string.append(ch)
                    continue
                self._end_string(deltas)
            elif not was_string and ch == '"':
                self._string = []
            elif ch == ":":
                self._after_colon = True
            elif ch == ",":
                self._after_colon = False
            elif ch == "{" and self._after_colon and self._key == "parameters":
                self._arguments = ["{"]
                fragment.append("{")
            elif ch == "}":                        # the call object closed
                self._key, self._name, self._after_colon = None, None, False
        if self._arguments is not None and fragment:
            self._flush(deltas, fragment, ready=False)
        return deltas

    def _end_string(self, deltas: list[ToolCallDelta]) -> None:
        value = json.loads('"' + "".join(self._string) + '"')
        self._string = None
        if not self._after_colon:
            self._key = value
            return
        if self._key == "name" and self._name is None:
            self._name = value
            call = ToolCall(new_call_id(), value, "", False)
            self.calls.append(call)
            deltas.append(ToolCallDelta(len(self.calls) - 1, "", call.call_id, value))
            if self._pending:      # arguments that came before the name
                deltas.append(ToolCallDelta(len(self.calls) - 1, self._pending,
                                            ready=self._arguments is None))
                call.arguments, call.ready = self._pending, self._arguments is None
                self._pending = ""

    def _flush(self, deltas: list[ToolCallDelta], fragment: list[str], *, ready: bool) -> None:
        text = "".join(fragment)
        fragment.clear()
        if ready:
            self._arguments = None
        if self._name is None:     # the name is still to come: hold the arguments back
            self._pending += text
            return
        call = self.calls[-1]
        call.arguments += text
        call.ready = ready
        deltas.append(ToolCallDelta(len(self.calls) - 1, text, ready=ready))
