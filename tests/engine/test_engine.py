"""The engine end to end on the real SmolLM2: batching, chunked prefill, preemption,
prefix caching, stop conditions, aborts and bad input."""
from __future__ import annotations

import pytest

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.errors import PromptTooLongError
from instrumented_engine.engine.sampling import SamplingError, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
QUESTIONS = ["What is the capital of France?", "Name three colors.", "你好，你是谁？",
             "Write a haiku about the sea.", "What is 2 + 2?"]


def make_engine(loaded_model, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(**{"num_kv_blocks": 256, **overrides}), loaded=loaded_model)


def prompt_ids(engine: LLMEngine, question: str) -> list[int]:
    return engine.tokenize(engine.render_chat([{"role": "user", "content": question}]),
                           add_bos=False)


def run_all(engine: LLMEngine) -> dict[str, str]:
    texts: dict[str, list[str]] = {}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            texts.setdefault(out.request_id, []).append(out.text)
        steps += 1
        assert steps < 10_000, "engine did not finish"
    return {rid: "".join(parts) for rid, parts in texts.items()}


def generate_alone(engine: LLMEngine, ids: list[int], sampling=GREEDY) -> str:
    engine.add_request("alone", ids, sampling)
    return run_all(engine)["alone"]


def test_batched_greedy_equals_each_alone(loaded_model):
    engine = make_engine(loaded_model, enable_prefix_caching=False)
    prompts = [prompt_ids(engine, q) for q in QUESTIONS]
    alone = [generate_alone(engine, ids) for ids in prompts]
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, GREEDY)
    together = run_all(engine)
    assert [together[f"r{i}"] for i in range(len(prompts))] == alone
    assert all(text for text in alone)
    assert engine.block_manager.num_used_blocks == 0


def test_chunked_prefill_keeps_decodes_going_and_matches(loaded_model):
    engine = make_engine(loaded_model, max_num_batched_tokens=32, enable_prefix_caching=False)
    short = prompt_ids(engine, QUESTIONS[0])
    long = prompt_ids(engine, "Summarize: " + " ".join(["the quick brown fox"] * 40))
    expected_long = generate_alone(engine, long)
    expected_short = generate_alone(engine, short)
    engine.add_request("short", short, GREEDY)
    engine.step()  # short's prompt fits one step; it decodes from the next step on
    engine.add_request("long", long, GREEDY)
    decoding_during_prefill = 0
    texts = {"short": [], "long": []}
    while engine.has_unfinished():
        long_seq = engine._requests.get("long")
        prefilling = long_seq is not None and not long_seq.seq.is_prefill_done
        for out in engine.step():
            texts[out.request_id].append(out.text)
            decoding_during_prefill += prefilling and out.request_id == "short"
    assert decoding_during_prefill >= 3, "decodes stalled behind a chunked prefill"
    assert "".join(texts["long"]) == expected_long
    assert "".join(texts["short"]) == expected_short


def test_preemption_under_block_pressure_still_correct(loaded_model):
    roomy = make_engine(loaded_model, enable_prefix_caching=False)
    prompts = [prompt_ids(roomy, q) for q in QUESTIONS]
    sampling = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = [generate_alone(roomy, ids, sampling) for ids in prompts]
    # Just enough blocks for about two sequences at a time: the rest must be preempted.
    tight = make_engine(loaded_model, num_kv_blocks=8, enable_prefix_caching=False)
    seqs = [tight.add_request(f"r{i}", ids, sampling) for i, ids in enumerate(prompts)]
    got = run_all(tight)
    assert sum(s.num_preemptions for s in seqs) > 0, "the test did not create block pressure"
    assert [got[f"r{i}"] for i in range(len(prompts))] == expected
    assert tight.block_manager.num_used_blocks == 0


def test_prefix_cache_hit_reuses_blocks_and_output(loaded_model):
    engine = make_engine(loaded_model)
    system = "You are a meticulous assistant. " * 12
    ids = engine.tokenize(engine.render_chat([{"role": "system", "content": system},
                                              {"role": "user", "content": "Hi!"}]))
    cold = engine.add_request("cold", ids, GREEDY)
    cold_text = run_all(engine)["cold"]
    warm = engine.add_request("warm", ids, GREEDY)
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == (len(ids) - 1) // 16 * 16 > 0
    assert run_all(engine)["warm"] == cold_text
    assert engine.block_manager.num_used_blocks == 0


def test_stop_string_and_max_tokens(loaded_model):
    engine = make_engine(loaded_model)
    ids = prompt_ids(engine, "What is the capital of France?")
    full = generate_alone(engine, ids, SamplingParams(temperature=0.0, max_tokens=16))
    assert "Paris" in full
    stop_at = full.index("Paris")
    stopped = generate_alone(engine, ids, SamplingParams(temperature=0.0, max_tokens=16,
                                                         stop=("Paris",)))
    assert stopped == full[:stop_at]
    engine.add_request("len", ids, SamplingParams(temperature=0.0, max_tokens=3,
                                                  ignore_eos=True))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 3


def test_seeded_sampling_is_reproducible_and_batch_independent(loaded_model):
    engine = make_engine(loaded_model)
    ids = prompt_ids(engine, "Tell me a story.")
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=7, max_tokens=10,
                            ignore_eos=True)
    first = generate_alone(engine, ids, seeded)
    engine.add_request("other", prompt_ids(engine, "Hello"), SamplingParams(temperature=1.0,
                                                                           max_tokens=10))
    engine.add_request("again", ids, seeded)
    assert run_all(engine)["again"] == first


def test_abort_frees_blocks_at_once(loaded_model):
    engine = make_engine(loaded_model)
    engine.add_request("a", prompt_ids(engine, QUESTIONS[0]), GREEDY)
    engine.add_request("b", prompt_ids(engine, QUESTIONS[1]), GREEDY)
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    assert engine.abort("a") and engine.abort("b")
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.has_unfinished() and not engine.abort("a")


def test_bad_input_errors_name_the_numbers(loaded_model):
    engine = make_engine(loaded_model, max_model_len=64)
    with pytest.raises(PromptTooLongError) as err:
        engine.add_request("long", list(range(100, 170)), GREEDY)
    assert "64" in str(err.value) and "70" in str(err.value)
    with pytest.raises(SamplingError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(SamplingError, match="top_p"):
        SamplingParams(top_p=1.5)
    assert engine.block_manager.num_used_blocks == 0
