"""The engine's warm-up: made-up requests through the normal step loop before serving."""
from __future__ import annotations

from typing import TYPE_CHECKING

from instrumented_engine.engine.recorder import NoopRecorder
from instrumented_engine.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from instrumented_engine.engine.llm_engine import LLMEngine

# The warm-up's two requests never meet a client: their ids cannot come from the server,
# which names requests `chatcmpl-<hex>` / `cmpl-<hex>`.
WARMUP_REQUEST_IDS = ("warmup-0", "warmup-1")


def run_warm_up(engine: LLMEngine, prompt_tokens: int = 64, decode_steps: int = 3) -> float:
    """Run two made-up requests through the normal step loop before serving, so that
    whatever is built on first use (kernels compiled, allocator pools, thread pools) is
    not paid by a client's first request. Returns the seconds it took (`warmup_s`).

    It covers a multi-token prefill of two sequences in one step, a batched decode of
    both, then single-sequence decodes; bounded by `prompt_tokens` and `decode_steps`.
    Nothing is recorded (the recorder is a no-op meanwhile) and every KV block is free
    again afterwards. Call it on an idle engine, before admitting requests.
    """
    if engine.has_unfinished():
        raise RuntimeError("warm_up needs an idle engine")
    max_tokens = decode_steps + 1
    room = min(engine.max_model_len,
               engine.config.num_kv_blocks * engine.config.block_size // 2) - max_tokens
    lengths = (min(prompt_tokens, room), min(prompt_tokens, room) // 2)
    if lengths[1] < 2:
        raise RuntimeError(f"the engine is too small to warm up (room for {room} tokens)")
    vocab = engine.loaded.config.vocab_size
    sampling = (SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    # Ids away from the specials and different per request: no prefix-cache hit, either
    # between the two or with a real prompt (which starts with the chat template).
    prompts = [[(1000 + 7 * i + 3 * k) % vocab for i in range(n)]
               for k, n in enumerate(lengths)]
    budget = engine.config.max_num_batched_tokens
    max_steps = -(-sum(lengths) // budget) + max_tokens + 2
    recorder, engine.recorder = engine.recorder, NoopRecorder()
    start_ns = engine.clock_ns()
    try:
        for request_id, ids, params in zip(WARMUP_REQUEST_IDS, prompts, sampling):
            engine.add_request(request_id, ids, params)
        for _ in range(max_steps):
            for out in engine.step():
                if out.error is not None:
                    raise RuntimeError(f"the warm-up failed: {out.error}")
            if not engine.has_unfinished():
                break
        else:
            raise RuntimeError(f"the warm-up did not finish in {max_steps} steps")
    finally:
        for request_id in WARMUP_REQUEST_IDS:
            engine.abort(request_id)   # only when it failed half-way: frees its blocks
        engine.recorder = recorder
    return (engine.clock_ns() - start_ns) / 1e9
