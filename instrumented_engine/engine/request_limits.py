"""What a request may ask of the engine: its prompt's size before tokenizing, and whether
prompt and completion fit the context and the KV cache. Each refusal names the numbers."""
from __future__ import annotations

from dataclasses import dataclass

from instrumented_engine.engine.errors import EngineInputError, PromptTooLongError
from instrumented_engine.engine.sampling import SamplingParams


@dataclass(slots=True, frozen=True)
class RequestLimits:
    """The engine's bounds on one request.

    >>> limits = RequestLimits(max_model_len=8, max_token_bytes=4, kv_capacity_tokens=64)
    >>> limits.max_prompt_bytes
    32
    >>> limits.check_fit(3, SamplingParams(max_tokens=6))
    Traceback (most recent call last):
    ...
    instrumented_engine.engine.errors.PromptTooLongError: This model's maximum context length is 8 tokens. However, you requested 9 tokens (3 in the prompt, 6 for the completion).
    """

    max_model_len: int
    max_token_bytes: int         # the longest token's UTF-8 bytes
    kv_capacity_tokens: int      # num_kv_blocks * block_size

    @property
    def max_prompt_bytes(self) -> int:
        """A prompt of more UTF-8 bytes than this is surely over the context (no token stands
        for more than `max_token_bytes` bytes), so it is refused by its size, before the
        tokenizer spends time on it. Never refuses a prompt that would fit."""
        return self.max_model_len * self.max_token_bytes

    def check_prompt_size(self, text: str, param: str) -> None:
        """Refuse, before tokenizing, a prompt too big to fit or that is not valid Unicode."""
        max_prompt_bytes = self.max_prompt_bytes
        # A character is at least one byte: the length alone refuses the biggest prompts
        # without copying them.
        num_bytes = len(text)
        if num_bytes <= max_prompt_bytes:
            try:
                num_bytes = len(text.encode("utf-8"))
            except UnicodeEncodeError as exc:  # a lone surrogate from a JSON "\ud800" escape
                raise EngineInputError(
                    f"{param} is not valid Unicode: a lone UTF-16 surrogate "
                    f"({text[exc.start]!a}) at character {exc.start} of the prompt",
                    param=param) from None
        if num_bytes > max_prompt_bytes:
            raise EngineInputError(
                f"This model's maximum context length is {self.max_model_len} tokens, and no "
                f"token is longer than {self.max_token_bytes} bytes: a prompt over "
                f"{max_prompt_bytes} bytes of UTF-8 cannot fit (this one has at least "
                f"{num_bytes}).", param=param, code="context_length_exceeded")

    def check_fit(self, num_prompt_tokens: int, sampling: SamplingParams) -> None:
        """Raise a clear error naming both numbers when the request cannot fit."""
        if num_prompt_tokens == 0:
            raise EngineInputError("the prompt is empty after tokenization", param="messages")
        requested = num_prompt_tokens + sampling.max_tokens
        if requested > self.max_model_len:
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {requested} tokens ({num_prompt_tokens} in the prompt, "
                f"{sampling.max_tokens} for the completion).",
                num_prompt_tokens, self.max_model_len)
        if requested > self.kv_capacity_tokens:
            raise PromptTooLongError(
                f"The request needs {requested} tokens of KV cache ({num_prompt_tokens} in the "
                f"prompt, {sampling.max_tokens} for the completion) but the cache holds "
                f"{self.kv_capacity_tokens} tokens.", num_prompt_tokens, self.kv_capacity_tokens)
