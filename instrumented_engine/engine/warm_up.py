"""The engine's warm-up plan: which made-up requests `LLMEngine.warm_up` runs before serving.

A plan only, from the engine's sizes: the engine runs it through its own step loop, so this
module knows no engine (nano-vllm's `ModelRunner.warmup_model` is likewise the runner's own).
"""
from __future__ import annotations

from dataclasses import dataclass

from instrumented_engine.engine.sampling import SamplingParams

# The warm-up's two requests never meet a client: their ids cannot come from the server,
# which names requests `chatcmpl-<hex>` / `cmpl-<hex>`.
WARMUP_REQUEST_IDS = ("warmup-0", "warmup-1")


@dataclass(frozen=True, slots=True)
class WarmUpRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams


@dataclass(frozen=True, slots=True)
class WarmUpPlan:
    """Two requests and the most steps they may take: a multi-token prefill of both in one
    step, a batched decode of both, then single-sequence decodes of the longer one."""
    requests: tuple[WarmUpRequest, ...]
    max_steps: int


def plan_warm_up(*, max_model_len: int, kv_capacity_tokens: int, vocab_size: int,
                 max_num_batched_tokens: int, prompt_tokens: int = 64,
                 decode_steps: int = 3) -> WarmUpPlan:
    """The warm-up's requests, bounded by `prompt_tokens` and `decode_steps` and sized so
    both fit the context and half the KV cache at once.

    >>> plan = plan_warm_up(max_model_len=2048, kv_capacity_tokens=1024, vocab_size=49152,
    ...                     max_num_batched_tokens=512, prompt_tokens=40, decode_steps=3)
    >>> [len(r.prompt_token_ids) for r in plan.requests], plan.max_steps
    ([40, 20], 7)
    >>> plan_warm_up(max_model_len=5, kv_capacity_tokens=1024, vocab_size=100,
    ...              max_num_batched_tokens=512)
    Traceback (most recent call last):
    RuntimeError: the engine is too small to warm up (room for 1 tokens)
    """
    max_tokens = decode_steps + 1
    room = min(max_model_len, kv_capacity_tokens // 2) - max_tokens
    lengths = (min(prompt_tokens, room), min(prompt_tokens, room) // 2)
    if lengths[1] < 2:
        raise RuntimeError(f"the engine is too small to warm up (room for {room} tokens)")
    sampling = (SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    # Ids away from the specials and different per request: no prefix-cache hit, either
    # between the two or with a real prompt (which starts with the chat template).
    prompts = [[(1000 + 7 * i + 3 * k) % vocab_size for i in range(n)]
               for k, n in enumerate(lengths)]
    max_steps = -(-sum(lengths) // max_num_batched_tokens) + max_tokens + 2
    return WarmUpPlan(tuple(WarmUpRequest(*r) for r in zip(WARMUP_REQUEST_IDS, prompts, sampling)),
                      max_steps)
