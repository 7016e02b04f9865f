"""Long prompts share the step: the chunk cap of a long prompt, the limits on prompts left
mid-prefill, the knob off, and the real engine answering a short prompt first.

The fake engine of test_scheduler.py drives the scheduler and checks every step's KV slots.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.scheduler import Scheduler, SchedulerOutput
from test_scheduler import FakeEngine, expected_output


def make_engine(threshold: int, max_partial: int = 2, max_long: int = 1,
                **fake_args) -> FakeEngine:
    engine = FakeEngine(**{"block_size": 4, "num_kv_blocks": 64, "budget": 32, **fake_args})
    engine.config = replace(engine.config, long_prefill_token_threshold=threshold,
                            max_num_partial_prefills=max_partial,
                            max_long_partial_prefills=max_long)
    engine.sched = Scheduler(engine.config, engine.bm)
    return engine


def chunks(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(item.seq.request_id, item.num_new_tokens) for item in out.scheduled]


def partial_prefills(engine: FakeEngine, out: SchedulerOutput) -> tuple[int, int]:
    """(sequences the step leaves mid-prefill, of which long), counted from the plan."""
    threshold = engine.config.long_prefill_token_threshold
    left = [(i.seq.num_uncomputed_tokens, i.num_new_tokens) for i in out.scheduled]
    partial = [uncomputed for uncomputed, n in left if uncomputed > 1 and n < uncomputed]
    return len(partial), sum(0 < threshold < uncomputed for uncomputed in partial)


def test_a_long_prompt_is_capped_and_a_short_one_starts_beside_it():
    engine = make_engine(threshold=8, max_partial=1)  # the short one ends its prompt: no limit
    long = engine.add("long", [1] * 40, max_tokens=2)
    assert chunks(engine.step()) == [("long", 8)]  # not the whole budget of 32
    short = engine.add("short", [2] * 5, max_tokens=2)
    out = engine.step()
    assert chunks(out) == [("long", 8), ("short", 5)]
    assert out.scheduled[1].want_logits and short.num_output_tokens == 1
    assert long.num_output_tokens == 0
    engine.run_until_done()
    assert long.output_token_ids == expected_output([1] * 40, 2)
    assert short.output_token_ids == expected_output([2] * 5, 2)
    assert engine.bm.num_free_blocks == engine.bm.num_blocks


def test_knob_off_gives_a_running_prefill_the_whole_budget():
    engine = make_engine(threshold=0)
    long = engine.add("long", [1] * 40, max_tokens=2)
    assert chunks(engine.step()) == [("long", 32)]
    short = engine.add("short", [2] * 5, max_tokens=2)
    out = engine.step()  # the short one only gets what the long one's last chunk leaves
    assert chunks(out) == [("long", 8), ("short", 5)]
    assert long.num_output_tokens == short.num_output_tokens == 1
    engine.run_until_done()
    assert engine.bm.num_free_blocks == engine.bm.num_blocks


def test_a_second_long_prompt_waits_while_a_shorter_one_behind_it_starts():
    engine = make_engine(threshold=8, max_partial=2, max_long=1)
    first = engine.add("first", [1] * 20, max_tokens=1)
    assert chunks(engine.step()) == [("first", 8)]
    second = engine.add("second", [2] * 30, max_tokens=1)
    engine.add("short", [3] * 6, max_tokens=1)
    out = engine.step()
    assert chunks(out) == [("first", 8), ("short", 6)]
    assert list(engine.sched.waiting) == [second] and second.block_table == []
    out = engine.step()  # first's last chunk ends its prompt: second may start beside it
    assert chunks(out) == [("first", 4), ("second", 8)]
    engine.run_until_done()
    assert second.output_token_ids == expected_output([2] * 30, 1)
    assert first.output_token_ids == expected_output([1] * 20, 1)
    assert engine.bm.num_free_blocks == engine.bm.num_blocks


@pytest.mark.parametrize(("max_partial", "expected"), [
    (1, [("long", 8)]),                # the short one would be left mid-prefill: it waits
    (2, [("long", 8), ("short", 4)]),  # a second prompt may be left mid-prefill
])
def test_max_num_partial_prefills_bounds_prompts_left_mid_prefill(max_partial, expected):
    engine = make_engine(threshold=8, max_partial=max_partial, budget=12)
    engine.add("long", [1] * 40, max_tokens=1)
    engine.step()
    engine.add("short", [2] * 6, max_tokens=1)  # not long, but only 4 tokens of budget left
    assert chunks(engine.step()) == expected
    engine.run_until_done()
    assert engine.bm.num_free_blocks == engine.bm.num_blocks


@pytest.mark.parametrize("kwargs", [{"long_prefill_token_threshold": -1},
                                    {"max_num_partial_prefills": 0},
                                    {"max_long_partial_prefills": 0},
                                    {"max_num_partial_prefills": 1,
                                     "max_long_partial_prefills": 2}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(ValueError):
        EngineConfig(**kwargs)


prompts = st.lists(st.tuples(st.integers(1, 40),    # prompt length
                             st.integers(1, 4),     # max_tokens
                             st.integers(0, 6)),    # added at this step
                   min_size=1, max_size=6)


@settings(max_examples=120, deadline=None)
@given(prompts, st.integers(0, 12), st.integers(4, 24), st.integers(1, 3), st.integers(1, 3),
       st.booleans())
def test_random_workloads_keep_the_limits_and_leak_no_blocks(workload, threshold, budget,
                                                             max_partial, max_long, caching):
    max_long = min(max_long, max_partial)
    engine = make_engine(threshold, max_partial, max_long, budget=budget, num_kv_blocks=48,
                         prefix_caching=caching)
    seqs = {}
    while len(seqs) < len(workload) or engine.sched.has_unfinished:
        assert engine.num_steps < 1_000, "no progress: the scheduler is stuck"
        for i, (length, max_tokens, add_at) in enumerate(workload):
            if add_at == engine.num_steps:
                seqs[i] = engine.add(f"r{i}", [(i + k) % 5 for k in range(length)], max_tokens)
        out = engine.step()
        num_partial, num_long = partial_prefills(engine, out)
        assert num_partial <= max_partial and num_long <= max_long
        if threshold:
            assert all(item.num_new_tokens <= threshold for item in out.scheduled)
        elif not out.preempted:  # knob off: a prompt is left unfinished only by a full budget
            assert num_partial == 0 or out.num_batched_tokens == budget
    for i, seq in seqs.items():
        assert seq.output_token_ids == expected_output(seq.token_ids[:workload[i][0]],
                                                       workload[i][1])
    assert engine.bm.num_free_blocks == engine.bm.num_blocks


def test_the_engine_answers_a_short_prompt_before_a_long_one(loaded_model):
    engine = LLMEngine(EngineConfig(num_kv_blocks=256, max_num_batched_tokens=256,
                                    long_prefill_token_threshold=128), loaded=loaded_model)
    sampling = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request("long", [(7 * k) % 5000 + 10 for k in range(900)], sampling)
    engine.step()
    engine.add_request("short", [(3 * k) % 5000 + 10 for k in range(37)], sampling)
    first_token_step: dict[str, int] = {}
    step = 1
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            if out.num_output_tokens:
                first_token_step.setdefault(out.request_id, step)
    assert first_token_step["short"] == 2
    assert first_token_step["long"] == 900 // 128 + 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
