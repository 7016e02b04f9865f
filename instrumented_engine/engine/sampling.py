"""Per-request sampling parameters, validated once at the door."""
from __future__ import annotations

from dataclasses import dataclass

# Caps that keep one request from holding the engine hostage; the server maps
# violations to HTTP 400 with these numbers in the message.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
# OpenAI's ranges: temperature in [0, 2], top_p in (0, 1]. Both are applied to float32 logits,
# where 1e-300 is 0: a positive temperature below this floor is sampled at the floor (vLLM's
# `_MAX_TEMP` does the same), which is already greedy in all but exact ties. Clients that
# cannot send 0 (TGI refuses it) use 1e-5 or so to ask for greedy, so refusing them would
# break them; the floor keeps logits / temperature finite (|logit| < 3.4e36, far above any
# real logit). A top_p below the most likely token's mass keeps that token alone: greedy too.
MIN_SAMPLING_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 2.0
# torch.Generator.manual_seed takes a 64-bit value; OpenAI's `seed` is an int64.
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1


class SamplingError(ValueError):
    """A sampling parameter is out of range. `param` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    >>> SamplingParams(temperature=0.0, max_tokens=32).is_greedy
    True
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # A JSON schema (its text) the output must match: decoding is constrained to it, and
    # the output ends when the value is complete (instrumented_engine/engine/grammar.py).
    json_schema: str | None = None

    def __post_init__(self) -> None:
        # Written so that NaN fails every range check.
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise SamplingError(f"temperature must be in [0, 2], got {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.seed is not None and not MIN_SEED <= self.seed <= MAX_SEED:
            raise SamplingError("seed must be a 64-bit signed integer", "seed")
        if self.top_k < 0:
            raise SamplingError(f"top_k must be >= 0 (0 disables it), got {self.top_k}", "top_k")
        if self.max_tokens <= 0:
            raise SamplingError(f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}", "stop")
        if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise SamplingError(f"each stop string must have 1..{MAX_STOP_STRING_CHARS} characters", "stop")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def effective_temperature(self) -> float:
        """The temperature the sampler divides by: never below the float32-safe floor.

        >>> SamplingParams(temperature=1e-300).effective_temperature
        0.01
        """
        return max(self.temperature, MIN_SAMPLING_TEMPERATURE)
