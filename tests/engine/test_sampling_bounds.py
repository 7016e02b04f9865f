"""Sampling parameters that float32 cannot represent are bounded (issue 13, item 1): a tiny
temperature or top_p samples like greedy decoding instead of dividing by zero, and values
outside what the engine can honour are refused with the offending parameter named."""
from __future__ import annotations

import math

import pytest
import torch

from instrumented_engine.engine.sampler import Sampler
from instrumented_engine.engine.sampling import (MIN_SAMPLING_TEMPERATURE, SamplingError,
                                                 SamplingParams)

TINY = [5e-324, 1e-310, 1e-300, 1e-45, 1e-30, 1e-8]


@pytest.mark.parametrize("value", TINY)
def test_tiny_temperature_and_top_p_sample_the_top_token(value):
    torch.manual_seed(0)
    logits = torch.randn(8, 1000) * 20
    params = [SamplingParams(temperature=value), SamplingParams(top_p=value),
              SamplingParams(temperature=value, top_p=value, top_k=5)] * 2 + [
              SamplingParams(temperature=0.0)] * 2
    picks = Sampler().sample(logits, params, [None] * len(params))
    assert picks == logits.argmax(dim=-1).tolist()


def test_temperature_floor_keeps_logits_finite():
    # The largest float32 logit over the floor is still finite: softmax never sees inf - inf.
    scaled = torch.tensor([torch.finfo(torch.float32).max / 1e6]) / MIN_SAMPLING_TEMPERATURE
    assert torch.isfinite(scaled).all()


@pytest.mark.parametrize("field, value", [
    ("temperature", -1e-300), ("temperature", 2.0000001), ("temperature", math.inf),
    ("temperature", math.nan), ("top_p", 0.0), ("top_p", -0.5), ("top_p", math.nan),
    ("top_p", 1.5), ("seed", 2**64), ("seed", 2**63), ("seed", -(2**63) - 1),
    ("top_k", -1), ("max_tokens", 0)])
def test_out_of_range_is_refused_with_its_param(field, value):
    with pytest.raises(SamplingError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


@pytest.mark.parametrize("seed", [0, 2**63 - 1, -(2**63)])
def test_int64_seeds_are_accepted(seed):
    assert SamplingParams(seed=seed, temperature=1.0).seed == seed
