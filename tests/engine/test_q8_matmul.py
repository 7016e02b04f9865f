"""The hand-written int8 matmul (instrumented_engine/model/q8_matmul.c, quant.Int8Weight's small
steps) against torch's `_weight_int8pack_mm`, the kernel it replaces, and against float64 over
the whole bf16 range of activations.

The C has three paths (AVX-512, AVX2, scalar); each is built with the flags that select it
(`cpu_fused.load(isa)`) and tested wherever the host can run it, so an AVX-512 host tests all
three and an AVX2 host the two it would use. The activations are rounded to int16 per block of
32 (act_quant.h): the exact result is float64 of the rounded activations, within half a step
per activation of the given ones."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from instrumented_engine.model import cpu_fused
from instrumented_engine.model.cpu_fused import Q8_MAX_ROWS
from instrumented_engine.model.quant import Int8Weight
from tests.engine.test_q4_matmul import ISAS, per_block_rounding, random_finite_bf16


@pytest.fixture(scope="module", params=ISAS)
def ops(request):
    # The engine builds the library wherever a C compiler exists; make test has one (gcc).
    built = cpu_fused.load(request.param)
    assert built is not None, f"the fused CPU ops did not build for {request.param}"
    return built


def _weight(rng: np.random.Generator, n: int, k: int, spread: float) -> torch.Tensor:
    return torch.from_numpy(rng.uniform(-spread, spread, size=(n, k))).float()


def _torchs(w: Int8Weight, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x, w.codes, w.scale)


@pytest.mark.parametrize("rows", range(1, Q8_MAX_ROWS + 1))
def test_every_row_count_matches_float64_of_the_rounded_activations(ops, rows):
    rng = np.random.default_rng(rows)
    w = Int8Weight.quantize(_weight(rng, 80, 160, 0.05), ops)
    assert w.ops is ops
    x = torch.randn(rows, 160).to(torch.bfloat16)
    rounded, step = per_block_rounding(x)
    dequant = w.dequantize().double()
    exact = rounded @ dequant.t()
    got = w.matmul(x).double()
    magnitude = rounded.abs() @ dequant.abs().t()
    # fp32 accumulation of 160 products, then one bf16 rounding of the result.
    assert ((got - exact).abs() <= exact.abs() * 2 ** -8 + magnitude * 1e-5).all()
    truth = x.double() @ dequant.t()
    assert ((got - truth).abs() <= (step / 2) @ dequant.abs().t() + truth.abs() * 2 ** -8
            + magnitude * 1e-5).all()


def test_agrees_with_torchs_kernel_within_one_bf16_rounding(ops):
    rng = np.random.default_rng(11)
    w = Int8Weight.quantize(_weight(rng, 512, 576, 0.1), ops)
    for rows in (1, 4, Q8_MAX_ROWS):
        x = torch.randn(rows, 576).to(torch.bfloat16)
        ours, torchs = w.matmul(x).double(), _torchs(w, x).double()
        magnitude = x.double().abs() @ w.dequantize().double().abs().t()
        # Each is within a bf16 rounding of the exact product, plus our activations' rounding.
        assert ((ours - torchs).abs() <= (ours.abs() + torchs.abs()) * 2 ** -8
                + magnitude * 1e-4).all()


def test_the_whole_bf16_range_of_activations(ops):
    """Random bit patterns over every finite exponent: each block's scale follows its own
    magnitude, so tiny and huge blocks in one row are each within their own half step."""
    rng = np.random.default_rng(7)
    w = Int8Weight.quantize(_weight(rng, 32, 64 * 32, 1e-2), ops)
    dequant = w.dequantize().double()
    for _ in range(20):
        x = random_finite_bf16(rng, (3, 64 * 32))
        # Keep the products finite in fp32: |x| <= 1e30 with |w| <= 0.01 and 2,048 terms.
        x = torch.where(x.float().abs() > 1e30, torch.zeros_like(x), x)
        _, step = per_block_rounding(x)
        got = w.matmul(x).double()
        truth = x.double() @ dequant.t()
        bound = ((step / 2) @ dequant.abs().t() + (x.double().abs() @ dequant.abs().t()) * 2 ** -7
                 + 1e-30)
        assert torch.isfinite(got).all()
        assert ((got - truth).abs() <= bound).all()


def test_zero_rows_and_non_finite_rows(ops):
    rng = np.random.default_rng(3)
    weight = _weight(rng, 16, 64, 0.1)
    w = Int8Weight.quantize(weight, ops)
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    x[1, 5] = float("nan")
    x[2, 40] = float("inf")
    x[3, :32] = torch.linspace(-2, 2, 32)
    out = w.matmul(x)
    assert out[0].eq(0).all()                              # all-zero row: exactly zero
    assert out[1].isnan().all() and out[2].isnan().all()   # as a float matmul would give
    assert torch.isfinite(out[3]).all()                    # bystander rows are untouched
    assert torch.allclose(out[3:].double(), x[3:].double() @ weight.double().t(),
                          rtol=0.02, atol=0.02)


def test_bigger_steps_no_rows_and_odd_widths_take_torchs_kernel(ops):
    rng = np.random.default_rng(5)
    w = Int8Weight.quantize(_weight(rng, 16, 64, 0.1), ops)
    x = torch.randn(Q8_MAX_ROWS + 1, 64).to(torch.bfloat16)
    assert torch.equal(w.matmul(x), _torchs(w, x))
    # A step whose sequences all skip their logits (a prefill chunk) asks for none.
    assert w.matmul(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 16)
    odd = Int8Weight.quantize(_weight(rng, 16, 48, 0.1), ops)     # 48: not a multiple of 32
    assert odd.ops is None
    x = torch.randn(1, 48).to(torch.bfloat16)
    assert torch.equal(odd.matmul(x), _torchs(odd, x))


def test_refuses_inputs_it_cannot_read(ops):
    w = Int8Weight.quantize(torch.zeros(16, 64), ops)
    for bad in (torch.zeros(1, 96, dtype=torch.bfloat16), torch.zeros(1, 64)):
        with pytest.raises(ValueError):
            ops.q8_matmul(bad, w.codes, w.scale)
