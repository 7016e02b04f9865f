"""OpenAI request schemas and the OpenAI error shape.

Validation happens here, once, before the engine sees anything; every failure becomes a
`OpenAIError` with an HTTP status and the offending `param`, never a 500. An option that
would change the output and is not implemented is refused, not dropped
(`instrumented_engine/server/request_options.py`).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from instrumented_engine.engine.sampling import SamplingError, SamplingParams
from instrumented_engine.server.request_options import (
    CHAT_NO_OP_VALUES,
    COMPLETION_NO_OP_VALUES,
    refuse_unsupported,
)
from instrumented_engine.server.tool_choice import ToolPlan, tool_plan
from tracer.web.openai_http import OpenAIError


class _Lenient(BaseModel):
    # Fields no API defines are ignored, as OpenAI-compatible servers do; known ones are
    # strict, and the unimplemented ones are refused before validation (`parse_request`).
    model_config = ConfigDict(extra="ignore", strict=False)


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Sampling(_Lenient):
    # The fields refused unless they carry their no-op value.
    no_op_values: ClassVar[Mapping[str, Callable[[object], bool]]] = COMPLETION_NO_OP_VALUES
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    def sampling_params(self, max_tokens_default: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=self.top_k or 0, seed=self.seed,
                max_tokens=max_tokens_default if self.max_tokens is None else self.max_tokens,
                stop=stop, stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos)
        except SamplingError as exc:
            raise OpenAIError(400, str(exc), param=exc.param) from exc

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    no_op_values: ClassVar[Mapping[str, Callable[[object], bool]]] = CHAT_NO_OP_VALUES
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    # Checked by `tool_plan` (tool_choice.py), which names the field at fault.
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def tool_plan(self) -> ToolPlan | None:
        return tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls)

    def sampling_params(self, max_tokens_default: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(max_tokens_default)

    def template_messages(self) -> list[dict]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("exactly one prompt is supported")
        return prompt

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def _reject_constant(name: str):
    # Python's json reads NaN and Infinity, which RFC 8259 JSON does not have.
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def parse_request(body: bytes, schema: type[_Sampling]) -> _Sampling:
    """bytes → validated request, or a 400 naming what is wrong."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError:
        raise OpenAIError(400, "request body is nested too deeply", code="invalid_json") from None
    except ValueError:  # an integer past Python's int_max_str_digits (4300 by default)
        raise OpenAIError(400, "request body has a number with too many digits",
                          code="invalid_json") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "request body must be a JSON object", code="invalid_json")
    refuse_unsupported(data, schema.no_op_values, chat=schema is ChatCompletionRequest)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise OpenAIError(400, f"{param}: {first['msg']}" if param else first["msg"],
                            param=param) from exc
