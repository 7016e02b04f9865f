"""Which request options the engine implements, accepts as no-ops, or refuses.

A client that asks for JSON, a tool call, log-probabilities or a penalty and silently gets
plain sampled text has no way to know; so every OpenAI field (and the vLLM extensions that
OpenAI clients send to vLLM-compatible servers) that changes the output and is not
implemented here is refused with a 400 naming it, unless it carries its no-op value (null,
`false`, 0, an empty list or object, `{"type": "text"}`...). Fields that do not change the
output (`user`, `metadata`, `store`, ...) are accepted; fields no API defines are ignored, as
OpenAI-compatible servers do. docs/reference.md, "Supported request options", has the table.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from tracer.web.openai_http import OpenAIError


def _absent(value: object) -> bool:
    return value is None


def _false(value: object) -> bool:
    return value is None or value is False


def _true(value: object) -> bool:
    return value is None or value is True


def _zero(value: object) -> bool:
    return value is None or (type(value) in (int, float) and value == 0)


def _one(value: object) -> bool:
    return value is None or (type(value) in (int, float) and value == 1)


def _empty(value: object) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _text_format(value: object) -> bool:
    return value is None or value == {"type": "text"}


def _text_only(value: object) -> bool:
    return value is None or value == ["text"]


# field -> "this value changes nothing". Shared by both endpoints.
_COMMON: dict[str, Callable[[object], bool]] = {
    "frequency_penalty": _zero, "presence_penalty": _zero, "logit_bias": _empty,
    "response_format": _text_format,
    # vLLM's sampling and structured-output extensions.
    "repetition_penalty": _one, "min_p": _zero, "min_tokens": _zero,
    "include_stop_str_in_output": _false, "skip_special_tokens": _true,
    "spaces_between_special_tokens": _true, "bad_words": _empty,
    "allowed_token_ids": _absent, "prompt_logprobs": _absent, "use_beam_search": _false,
    "truncate_prompt_tokens": _absent, "structured_outputs": _absent,
    "guided_json": _absent, "guided_regex": _absent, "guided_choice": _absent,
    "guided_grammar": _absent, "logits_processors": _absent,
}
CHAT_NO_OP_VALUES: Mapping[str, Callable[[object], bool]] = {
    **_COMMON,
    "logprobs": _false, "top_logprobs": _zero, "audio": _absent, "modalities": _text_only,
    "reasoning_effort": _absent, "verbosity": _absent, "web_search_options": _absent,
    "echo": _false, "add_generation_prompt": _true, "continue_final_message": _false,
    "chat_template": _absent, "chat_template_kwargs": _empty,
}
# The legacy endpoint's `logprobs` is a count: any number, 0 included, asks for them.
COMPLETION_NO_OP_VALUES: Mapping[str, Callable[[object], bool]] = {
    **_COMMON,
    "logprobs": _absent, "best_of": _one, "echo": _false, "suffix": _empty,
}


def refuse_unsupported(data: dict, no_op_values: Mapping[str, Callable[[object], bool]],
                       *, chat: bool) -> None:
    """Raise a 400 naming the first option that asks for something not implemented.

    >>> refuse_unsupported({"logprobs": False, "user": "u"}, CHAT_NO_OP_VALUES, chat=True)
    >>> refuse_unsupported({"logprobs": True}, CHAT_NO_OP_VALUES, chat=True)
    Traceback (most recent call last):
    tracer.web.openai_http.OpenAIError: `logprobs` is not supported by this engine (got true).
    """
    for name, is_no_op in no_op_values.items():
        if name in data and not is_no_op(data[name]):
            _refuse(name, data[name])
    if chat:
        _refuse_tool_calling(data)


def _refuse_tool_calling(data: dict) -> None:
    # Tools offered with "none" are never called, so the answer is text either way. With
    # "required" or a named function the call is constrained decoding (tool_choice.py). With
    # "auto", the default once tools are given, the model itself must decide whether to call
    # one, which SmolLM2-135M cannot do. The legacy `functions` stay unimplemented.
    choice = data.get("function_call")
    if choice not in (None, "none", "auto"):
        _refuse("function_call", choice)
    if not _empty(data.get("functions")) and choice != "none":
        raise OpenAIError(400, "`functions` is not supported by this engine: send `tools` "
                          'with tool_choice "required" or a named function, or '
                          'function_call: "none".', param="functions",
                          code="unsupported_parameter")
    if not _empty(data.get("tools")) and data.get("tool_choice") in (None, "auto"):
        raise OpenAIError(400, '`tools` with tool_choice "auto" (the default when tools are '
                          "given) is not supported by this engine: its model cannot decide "
                          'when to call a tool. Send tool_choice "required" or {"type": '
                          '"function", "function": {"name": ...}} to have it call one, or '
                          '"none".', param="tools", code="unsupported_parameter")


def _refuse(name: str, value: object) -> None:
    # A short rendering of the value: a request string is not echoed whole.
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:40] + "..."
    raise OpenAIError(400, f"`{name}` is not supported by this engine (got {shown}).",
                      param=name, code="unsupported_parameter")
