"""Closed label vocabularies: the model a request is labelled with, the prefix-cache outcome
and the prompt-length bucket that split TTFT (docs/reference.md, "Metrics"). Standard library
only, so any sink or dashboard test can use the same rule."""
from __future__ import annotations

from collections.abc import Container

# The label of every value outside a closed list: a model nobody serves, an unknown stage,
# error type or outcome. Values in records, spans and labels never come from the request.
OTHER = "other"

# The split of TTFT by prefix-cache outcome and prompt length (docs/reference.md, "Metrics").
CACHE_OUTCOMES = ("hit", "partial", "miss")
# A hit leaves at most this many prompt tokens, or a tenth of the prompt, to prefill.
HIT_MAX_UNCACHED_TOKENS = 64
HIT_MAX_UNCACHED_SHARE = 0.1
# (label, exclusive upper bound in prompt tokens); the last bucket is unbounded.
PROMPT_LEN_BUCKETS = (("lt256", 256), ("lt1k", 1024), ("lt4k", 4096), ("lt16k", 16384),
                      ("ge16k", None))

def model_label(model: str, served: Container[str]) -> str:
    """The model as records, span names and labels carry it: a served name, else `OTHER`.

    >>> model_label("smollm2", {"smollm2"}), model_label("evil<script>", {"smollm2"})
    ('smollm2', 'other')
    """
    return model if model in served else OTHER


def cache_outcome(num_prompt_tokens: int, num_cached_tokens: int) -> str:
    """`miss`: nothing came from the prefix cache. `hit`: the part left to prefill is at most
    `HIT_MAX_UNCACHED_TOKENS` tokens or `HIT_MAX_UNCACHED_SHARE` of the prompt. `partial`:
    in between.

    The absolute allowance exists because a paged engine never serves the block holding the
    last prompt token from its cache (it needs that token's logits): even a fully reused
    prompt leaves up to one block (16 tokens in our engine and vLLM) to compute, and no
    block size is known to a proxy. The share makes a long prompt whose tail is a new user
    turn (a chat's history cached, 5 % new) a hit: its prefill is a small fraction of a
    miss's, which is the bimodality the split is for.

    >>> cache_outcome(40, 0), cache_outcome(40, 32), cache_outcome(2000, 1000), cache_outcome(2000, 1850)
    ('miss', 'hit', 'partial', 'hit')
    """
    if num_cached_tokens <= 0:
        return "miss"
    uncached = num_prompt_tokens - num_cached_tokens
    if uncached <= max(HIT_MAX_UNCACHED_TOKENS, HIT_MAX_UNCACHED_SHARE * num_prompt_tokens):
        return "hit"
    return "partial"


def prompt_len_bucket(num_prompt_tokens: int) -> str:
    """The `prompt_len` label: lt256 (< 256 tokens), lt1k (< 1024), lt4k (< 4096), lt16k
    (< 16384), ge16k.

    >>> [prompt_len_bucket(n) for n in (1, 255, 256, 1023, 4096, 16383, 16384)]
    ['lt256', 'lt256', 'lt1k', 'lt1k', 'lt16k', 'lt16k', 'ge16k']
    """
    for label, limit in PROMPT_LEN_BUCKETS:
        if limit is None or num_prompt_tokens < limit:
            return label
    raise AssertionError("PROMPT_LEN_BUCKETS ends with an unbounded bucket")
