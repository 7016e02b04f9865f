"""Errors the engine raises: bad input (the server answers OpenAI-shaped 400s) and a failure
of the engine on one request (a 500 for that request alone)."""
from __future__ import annotations


class EngineInputError(ValueError):
    """Input the engine cannot serve. `param` names the request field, `code` is machine-readable."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class PromptTooLongError(EngineInputError):
    """The prompt (plus the tokens asked for) does not fit the context or the KV cache."""

    def __init__(self, message: str, num_prompt_tokens: int, limit_tokens: int) -> None:
        super().__init__(message, param="messages", code="context_length_exceeded")
        self.num_prompt_tokens = num_prompt_tokens
        self.limit_tokens = limit_tokens


class EngineRequestError(RuntimeError):
    """The engine failed while computing this request; the other requests carry on."""


class SlowReaderError(RuntimeError):
    """The reader of a stream fell too far behind: the engine aborted the request and freed
    its KV blocks (`instrumented_engine/engine/async_engine.py`, `MAX_PENDING_OUTPUTS`)."""
