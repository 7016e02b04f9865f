"""The engine's step record on the real SmolLM2 (issue 36, item 1): every forward pass is kept
with what it computed for whom, so the tokens add up to what each request needed, and the
ring stays bounded. docs/architecture.md, "Neighbours"."""
from __future__ import annotations

from collections import Counter

from instrumented_engine.engine.sampling import SamplingParams
from tests.engine.test_engine import make_engine, prompt_ids, run_all

SAMPLING = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_every_step_accounts_for_each_requests_tokens(loaded_model):
    engine = make_engine(loaded_model, max_num_batched_tokens=64, max_num_seqs=4,
                         long_prefill_token_threshold=0, enable_prefix_caching=False)
    long_ids = prompt_ids(engine, " ".join(f"word{i}" for i in range(60)))
    short_ids = prompt_ids(engine, "Hi!")
    engine.add_request("long", long_ids, SAMPLING)
    engine.step()                                   # the long prompt's first chunk
    engine.add_request("short", short_ids, SAMPLING)
    run_all(engine)

    steps = engine.steps.between(0, 2 ** 63)
    assert len(steps) == engine.steps.num_steps == len(engine.steps)
    prefilled, decoded = Counter(), Counter()
    for step in steps:
        assert step.start_ns <= step.end_ns
        assert step.num_prefill_tokens + step.num_decode_seqs <= 64
        decodes = step.request_ids[:step.num_decode_seqs]
        assert all(n == 1 for n in step.num_tokens[:step.num_decode_seqs])
        decoded.update(decodes)
        for rid, n in zip(step.request_ids[step.num_decode_seqs:],
                          step.num_tokens[step.num_decode_seqs:]):
            prefilled[rid] += n
        assert step.num_prefill_tokens == sum(step.num_tokens[step.num_decode_seqs:])
        assert step.kind == ("prefill" if not step.num_decode_seqs else
                             "mixed" if step.num_prefill_tokens else "decode")
    # Each prompt prefilled once (no prefix cache), then one decode per later token.
    assert prefilled == {"long": len(long_ids), "short": len(short_ids)}
    assert decoded == {"long": SAMPLING.max_tokens - 1, "short": SAMPLING.max_tokens - 1}
    # The long prompt took several chunked steps; the short one shared at least one with it.
    assert sum(1 for s in steps if "long" in s.request_ids[s.num_decode_seqs:]) >= 2
    assert any({"long", "short"} <= set(s.request_ids) for s in steps)
    # Steps follow each other.
    assert all(a.end_ns <= b.start_ns for a, b in zip(steps, steps[1:]))


def test_the_ring_keeps_the_last_steps_and_warm_up_records_none(loaded_model):
    engine = make_engine(loaded_model, step_log_size=3)
    engine.warm_up(prompt_tokens=16, decode_steps=2)
    assert engine.steps.num_steps == 0 and len(engine.steps) == 0
    engine.add_request("r", prompt_ids(engine, "Count to five."), SAMPLING)
    run_all(engine)
    assert len(engine.steps) == 3 and engine.steps.num_steps == SAMPLING.max_tokens
    assert make_engine(loaded_model, step_log_size=0).steps.between(0, 2 ** 63) == []
