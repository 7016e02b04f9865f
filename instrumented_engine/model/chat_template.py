"""The model's Jinja chat template, rendered the way transformers' `apply_chat_template` does.

Templates ship inside model files, so they are untrusted code: they run in Jinja's immutable
sandbox, with the same helpers transformers exposes (`raise_exception`, `strftime_now`, a
`tojson` that does not HTML-escape) so that a template renders here exactly as it does there.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template is broken or rejected the messages; the server answers HTTP 400."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes `<`, `>`, `&` and `'`; chat templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _build_environment(now: Callable[[], datetime]) -> ImmutableSandboxedEnvironment:
    # Same options as transformers' _compile_jinja_template: whitespace control changes output.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
    return env


def _normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain dicts, without None-valued keys (as transformers does: OpenAI clients send
    `content=None` with tool calls, and templates handle a missing key but print 'None')."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of objects")
    normalized = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"messages[{index}] must be an object, got {type(message).__name__}")
        normalized.append({key: value for key, value in message.items() if value is not None})
    return normalized


class ChatTemplate:
    """A chat template compiled once, rendered per request.

    >>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    ...                  "{% if add_generation_prompt %}<assistant>{% endif %}", "<s>", "</s>")
    >>> t.render([{"role": "user", "content": "Hi"}])
    '<user>Hi<assistant>'
    """

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None,
                 now: Callable[[], datetime] = datetime.now) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _build_environment(now).from_string(source)
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(f"invalid chat template: {error}") from error

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt string; `extra` (e.g. `tools`) is passed to the template as variables."""
        # tools/documents default to None, not undefined: `tools is not none` must read False.
        variables = {"tools": None, "documents": None,
                     "bos_token": self.bos_token, "eos_token": self.eos_token, **extra}
        try:
            return self._template.render(
                messages=_normalize_messages(messages),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except ChatTemplateError:
            raise
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(f"chat template rejected the messages: {error}") from error
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as error:
            # e.g. a content list where the template concatenates strings
            raise ChatTemplateError(f"chat template failed on these messages: {error!r}") from error
