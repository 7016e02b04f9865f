"""Synthetic, seeded prompts for the load generator, with a shared prefix to exercise prefix caching.

Length is approximated in words: each word below is one token (after a space) in SmolLM2's
byte-level BPE, and about one in most others. Exact counts come back in each response's `usage`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

_WORDS: tuple[str, ...] = tuple("""
the of and to in is it that was for on are with as his they be at one have this from or had by
hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form great think say help low line turn cause much mean before move right boy old
too same tell does set three want air well also play small end put home read hand port large
spell add even land here must big high such follow act why ask men change went light kind off
need house picture try us again animal point mother world near build self earth father
""".split())


@dataclass(slots=True, frozen=True)
class PromptSpec:
    """How long prompts are and how much of them every request shares.

    Example:
        spec = PromptSpec(num_prompt_tokens=512, shared_prefix_ratio=0.75, seed=1)
        prompts = make_prompts(spec, num_prompts=10)
    """

    num_prompt_tokens: int = 256
    shared_prefix_ratio: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError("num_prompt_tokens must be >= 1")
        if not 0.0 <= self.shared_prefix_ratio <= 1.0:
            raise ValueError("shared_prefix_ratio must be in [0, 1]")

    @property
    def num_shared_words(self) -> int:
        return round(self.num_prompt_tokens * self.shared_prefix_ratio)


@dataclass(slots=True, frozen=True)
class SyntheticPrompt:
    """One prompt: a prefix identical across requests, then a per-request suffix."""

    shared_prefix: str
    unique_suffix: str

    def as_text(self) -> str:
        return " ".join(part for part in (self.shared_prefix, self.unique_suffix) if part)

    def as_messages(self) -> list[dict]:
        # The shared part is a system prompt, the way chat services share one across users.
        if self.shared_prefix and self.unique_suffix:
            return [{"role": "system", "content": self.shared_prefix},
                    {"role": "user", "content": self.unique_suffix}]
        return [{"role": "user", "content": self.as_text()}]


def _random_words(rng: random.Random, num_words: int) -> list[str]:
    return [rng.choice(_WORDS) for _ in range(num_words)]


def make_prompts(spec: PromptSpec, num_prompts: int, first_index: int = 0) -> list[SyntheticPrompt]:
    """`num_prompts` prompts for request indices first_index, first_index + 1, ...

    The same (spec, index) always gives the same prompt; string seeds are hashed with SHA-512 by
    `random.Random`, so this holds across processes and PYTHONHASHSEED values.
    """
    shared_prefix = " ".join(_random_words(random.Random(f"{spec.seed}:shared"), spec.num_shared_words))
    num_unique_words = spec.num_prompt_tokens - spec.num_shared_words
    prompts = []
    for index in range(first_index, first_index + num_prompts):
        words = []
        if num_unique_words > 0:
            # The index tag makes every suffix differ from its first token, so a prefix cache
            # can never match past the shared part by luck.
            words = [f"#{index}"] + _random_words(random.Random(f"{spec.seed}:{index}"), num_unique_words - 1)
        prompts.append(SyntheticPrompt(shared_prefix=shared_prefix, unique_suffix=" ".join(words)))
    return prompts


def build_request_body(endpoint: str, model: str, prompt: SyntheticPrompt, num_output_tokens: int) -> dict:
    """The streaming request body for `/v1/chat/completions`, `/v1/completions`, Anthropic's
    `/v1/messages` (the shared prefix as `system`) or the Responses API's `/v1/responses`
    (the shared prefix as `instructions`)."""
    if endpoint == "messages":
        body = {"model": model, "max_tokens": num_output_tokens, "temperature": 0.0,
                "stream": True, "messages": [{"role": "user", "content": prompt.unique_suffix
                                              or prompt.as_text()}]}
        if prompt.shared_prefix and prompt.unique_suffix:
            body["system"] = prompt.shared_prefix
        return body
    if endpoint == "responses":
        body = {"model": model, "max_output_tokens": num_output_tokens, "temperature": 0.0,
                "stream": True, "input": prompt.unique_suffix or prompt.as_text()}
        if prompt.shared_prefix and prompt.unique_suffix:
            body["instructions"] = prompt.shared_prefix
        return body
    body: dict = {
        "model": model,
        "max_tokens": num_output_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM/SGLang extra: generate exactly max_tokens. Servers that don't know it ignore it.
        "ignore_eos": True,
    }
    if endpoint == "chat":
        body["messages"] = prompt.as_messages()
    elif endpoint == "completions":
        body["prompt"] = prompt.as_text()
    else:
        raise ValueError("endpoint must be 'chat', 'completions', 'messages' or 'responses', "
                         f"got {endpoint!r}")
    return body
