"""The batched sampler (instrumented_engine/engine/sampler.py) against the per-row reference it
replaced: the same kept tokens after top-k and top-p, the same distribution (torch.multinomial's
is the reference), zero-probability tokens never drawn, seeded rows independent of the batch,
and a broken row failing alone."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from instrumented_engine.engine.sampler import (
    NUCLEUS_CANDIDATES,
    Sampler,
    filtered_probabilities,
    inverse_cdf,
)
from instrumented_engine.engine.sampling import SamplingParams


def reference_kept(row: torch.Tensor, p: SamplingParams) -> set[int]:
    """The tokens the previous per-row sampler could draw: a full sort, no candidate window."""
    logits = row / p.effective_temperature
    if 0 < p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, descending=True)
    if p.top_p < 1.0:
        drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
        drop[0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return set(sorted_ids[sorted_probs > 0].tolist())


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.sampled_from([2, 50, NUCLEUS_CANDIDATES + 1, 5000]),
       spread=st.sampled_from([0.01, 1.0, 10.0]), data=st.data(), seed=st.integers(0, 2**31))
def test_kept_tokens_equal_the_full_sort_reference(rows, vocab, spread, data, seed):
    # spread 0.01 makes flat rows, whose nucleus is wider than the candidate window.
    torch.manual_seed(seed)
    logits = torch.randn(rows, vocab) * spread
    params = [SamplingParams(temperature=data.draw(st.sampled_from([0.05, 0.7, 1.0, 2.0])),
                             top_p=data.draw(st.sampled_from([1e-30, 0.3, 0.9, 0.999, 1.0])),
                             top_k=data.draw(st.sampled_from([0, 2, 40, vocab + 5])))
              for _ in range(rows)]
    params = [p for p in params if not p.is_greedy] or [SamplingParams(temperature=1.0)]
    logits = logits[:len(params)]
    probs = filtered_probabilities(logits, params)
    for row, p, got in zip(logits, params, probs):
        assert set(got.nonzero().flatten().tolist()) == reference_kept(row, p)


def test_the_draws_follow_the_distribution_like_multinomial():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.0, 0.25, 0.125, 0.0, 0.0625, 0.0625])
    draws = 40_000
    tokens, valid = inverse_cdf(probs.expand(draws, -1).contiguous(), torch.rand(draws))
    assert valid.all()
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0
    expected = probs.double() * draws
    support = probs > 0
    chi2 = ((counts[support] - expected[support]) ** 2 / expected[support]).sum().item()
    reference = torch.bincount(torch.multinomial(probs, draws, replacement=True),
                               minlength=probs.numel()).double()
    chi2_reference = ((reference[support] - expected[support]) ** 2 / expected[support]).sum().item()
    # 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
    assert chi2 < 18.47 and chi2_reference < 18.47, (chi2, chi2_reference)


@pytest.mark.parametrize("total", [1.0, 2.0 ** -20, 1.0000001, 3.0])
def test_a_uniform_at_the_top_never_draws_a_trailing_zero(total):
    probs = torch.tensor([[0.0, total * 0.3, 0.0, total * 0.7, 0.0, 0.0]])
    for u in (0.0, 0.5, 1.0 - 2.0 ** -24):
        tokens, valid = inverse_cdf(probs, torch.tensor([u]))
        assert valid.item() and tokens.item() in (1, 3)


def test_a_broken_row_fails_alone_and_seeded_rows_ignore_their_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 300)
    logits[1] = float("nan")
    logits[2, 7] = float("inf")
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    params = [seeded, SamplingParams(temperature=1.0), SamplingParams(temperature=0.8),
              SamplingParams(temperature=0.0)]
    gens = [torch.Generator().manual_seed(42), None, None, None]
    picks = Sampler().sample_isolated(logits, params, gens)
    assert isinstance(picks[1], RuntimeError) and isinstance(picks[2], RuntimeError)
    assert picks[3] == int(logits[3].argmax())
    alone = Sampler().sample_isolated(logits[:1], [seeded], [torch.Generator().manual_seed(42)])
    assert picks[0] == alone[0]


def test_greedy_and_sampled_rows_mix_in_one_batch():
    logits = torch.tensor([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0], [0.0, 0.0, 30.0]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0.5, top_p=0.5)]
    assert Sampler().sample(logits, params, [None] * 3) == [1, 0, 2]
