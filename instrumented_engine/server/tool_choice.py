"""`tools` and `tool_choice` on /v1/chat/completions: which calls the model must make, and the
JSON schema its decoding is constrained to (docs/reference.md, "Tool calls").

Two choices are served, as vLLM serves them with guided decoding
(vllm/entrypoints/openai/protocol.py, `ChatCompletionRequest._get_guided_json_from_tool`, at
commit 0052bed36509):
- a named function (`{"type": "function", "function": {"name": "get_weather"}}`): the output
  is that function's arguments, constrained to its `parameters` schema;
- `"required"`: the output is a JSON array of `{"name": <an offered tool>, "parameters": <its
  schema>}`, one or more calls (one at most with `parallel_tool_calls: false`).

`"auto"`, the default when tools are given, is refused before this (request_options.py):
SmolLM2-135M cannot tell when a call is wanted. Every malformed tool or choice is a 400 in
the OpenAI shape naming its field, never a 500; a schema the grammar library cannot compile
is found by the engine when it compiles it, and is a 400 on `tools` too (serving.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from instrumented_engine.server.tool_call_stream import NamedCallReader, RequiredCallReader
from tracer.web.openai_http import OpenAIError

# OpenAI's rule for a function name.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A function without parameters takes an empty object, as OpenAI documents.
_NO_PARAMETERS = {"type": "object", "properties": {}}
MAX_TOOLS = 128   # OpenAI's limit on `tools`


@dataclass(slots=True, frozen=True)
class ToolPlan:
    """What the answer must be. `function_name` is set for a named choice only."""

    required: bool                 # "required": an array of calls; else one named call
    function_name: str | None
    json_schema: str               # the grammar's schema, as text (SamplingParams.json_schema)

    def finish_reason(self, engine_reason: str) -> str:
        """The client's finish_reason: "tool_calls" for "required" and "stop" for a named
        function, as OpenAI answers (its staff, community.openai.com/t/731488: a forced
        named call says "stop") and vLLM since commit 470ad118 ("Align finish_reason when
        tool is called with OpenAI", #25054); "length" stays "length"."""
        return "tool_calls" if self.required and engine_reason == "stop" else engine_reason

    def reader(self) -> NamedCallReader | RequiredCallReader:
        """Reads this plan's constrained output into calls (tool_call_stream.py)."""
        return RequiredCallReader() if self.required else NamedCallReader(self.function_name)


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")


def _parameters(function: dict, index: int) -> dict:
    params = function.get("parameters")
    if params is None:
        return _NO_PARAMETERS
    if not isinstance(params, dict):
        raise _bad("tools", f"tools[{index}].function.parameters must be a JSON Schema object.")
    if params.get("type", "object") != "object":
        raise _bad("tools", f"tools[{index}].function.parameters must describe an object "
                   f"(\"type\": \"object\"), got {json.dumps(params.get('type'))[:40]}.")
    # The arguments are always an object: also when the schema leaves its type open.
    return {**params, "type": "object"}


def _functions(tools: object) -> dict[str, dict]:
    """name → parameters schema, in the order offered."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad("tools", f"`tools` must be a list of at most {MAX_TOOLS} tools.")
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise _bad("tools", f'tools[{i}] must be {{"type": "function", "function": {{...}}}}.')
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _bad("tools", f"tools[{i}].function.name must be 1 to 64 letters, digits, "
                       "underscores or dashes.")
        if name in functions:
            raise _bad("tools", f"tools[{i}]: the function name {name!r} is offered twice.")
        functions[name] = _parameters(function, i)
    return functions


def _named(choice: dict) -> str:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise _bad("tool_choice", 'tool_choice must be "none", "auto", "required" or '
                   '{"type": "function", "function": {"name": ...}}.')
    return name


def tool_plan(tools: object, tool_choice: object,
              parallel_tool_calls: object = None) -> ToolPlan | None:
    """The plan for a request's tools and choice; None when the answer is text (no tools,
    or `"none"`). `"auto"` with tools was refused before (request_options.py).

    >>> tool = {"type": "function", "function": {"name": "f"}}
    >>> tool_plan([tool], {"type": "function", "function": {"name": "f"}}).json_schema
    '{"type": "object", "properties": {}}'
    >>> tool_plan([tool], "required").finish_reason("stop")
    'tool_calls'
    >>> tool_plan([tool], {"type": "function", "function": {"name": "g"}})
    Traceback (most recent call last):
    tracer.web.openai_http.OpenAIError: tool_choice names the function 'g', which is not in `tools`.
    """
    if tool_choice is None or tool_choice in ("none", "auto"):
        return None
    if not (tool_choice == "required" or isinstance(tool_choice, dict)):
        raise _bad("tool_choice", 'tool_choice must be "none", "auto", "required" or '
                   '{"type": "function", "function": {"name": ...}}.')
    name = _named(tool_choice) if isinstance(tool_choice, dict) else None
    if not tools:
        raise _bad("tool_choice", "tool_choice asks for a tool call, but no `tools` were given.")
    functions = _functions(tools)
    if name is not None:
        if name not in functions:
            raise _bad("tool_choice", f"tool_choice names the function {name[:64]!r}, "
                       "which is not in `tools`.")
        return ToolPlan(False, name, json.dumps(functions[name]))
    calls = {"anyOf": [{"type": "object", "properties": {"name": {"enum": [fn]},
                                                         "parameters": params},
                        "required": ["name", "parameters"], "additionalProperties": False}
                       for fn, params in functions.items()]}
    array = {"type": "array", "minItems": 1, "items": calls}
    if parallel_tool_calls is False:
        array["maxItems"] = 1
    return ToolPlan(True, None, json.dumps(array))
