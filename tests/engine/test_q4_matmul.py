"""The hand-written 4-bit matmul (instrumented_engine/model/q4_matmul.c, quant.Q4Weight) against
float64 over the whole bf16 range of activations, and against torch's int4 kernel on the
packaged model's own layers.

The C has three paths (AVX-512, AVX2, scalar, the last with its own fp16 conversion); each is
built with the flags that select it (`cpu_fused.load(isa)`) and tested wherever the host can
run it, so an AVX-512 host tests all three and an AVX2 host the two it would use.

The kernel rounds each block of 32 activations to int16 (scale = the block's max |x| / 32767), so
its exact result is float64 of the *rounded* activations; against the unrounded ones the error
is at most half a step per activation: sum_k |w_k| * scale_block / 2."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from instrumented_engine.model import cpu_fused
from instrumented_engine.model.cpu_fused import Q4_MAX_ROWS
from instrumented_engine.model.quant import GROUP_SIZE, Int4Weight, Q4Weight

_LEVELS = ("DEFAULT", "AVX2", "AVX512")
HOST = torch.backends.cpu.get_cpu_capability()
# The build levels this host runs, its own and those below it.
ISAS = _LEVELS[:_LEVELS.index(HOST) + 1] if HOST in _LEVELS else ("DEFAULT",)


@pytest.fixture(scope="module", params=ISAS)
def ops(request):
    # The engine builds the library wherever a C compiler exists; make test has one (gcc).
    built = cpu_fused.load(request.param)
    assert built is not None, f"the fused CPU ops did not build for {request.param}"
    return built


def bf16_from_bits(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)


def random_finite_bf16(rng: np.random.Generator, shape) -> torch.Tensor:
    """Every sign and every finite exponent, subnormals included, uniformly."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint32)
    bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0x807F, bits)     # no inf / NaN
    return bf16_from_bits(bits)


def per_block_rounding(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernel multiplies by, in float64: x rounded to int16 steps per block, as the C
    computes it in fp32 (step = max|x| / 32767, code = nearest-even of x · (1 / step)), and
    the step of each element's block."""
    xf = x.float().view(x.shape[0], -1, GROUP_SIZE)
    step = xf.abs().amax(-1, keepdim=True) / 32767
    tiny = step < torch.finfo(torch.float32).tiny          # the kernel treats these as zero
    safe = torch.where(tiny, torch.ones_like(step), step)
    q = torch.where(tiny, torch.zeros_like(xf), torch.round(xf * (1 / safe)).clamp(-32767, 32767))
    return (q.double() * safe.double()).view_as(x), safe.double().expand_as(xf).reshape(x.shape)


def random_weight(rng: np.random.Generator, n: int, k: int, spread: float) -> torch.Tensor:
    """A weight with Q4_1's structure: codes 0..15 times a per-32 scale plus a minimum, both
    fp16 values as the file stores them, each block holding a 0 and a 15 as llama.cpp's
    quantizer makes them."""
    codes = rng.integers(0, 16, size=(n, k // 32, 32))
    codes[..., 0], codes[..., 1] = 0, 15
    codes = torch.from_numpy(rng.permuted(codes, axis=-1).reshape(n, k)).float()
    scale = torch.from_numpy(rng.uniform(0, spread, size=(n, k // 32))).half().float()
    minimum = torch.from_numpy(rng.uniform(-8 * spread, 0, size=(n, k // 32))).half().float()
    return codes * scale.repeat_interleave(32, 1) + minimum.repeat_interleave(32, 1)


def split(q4: Q4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """W = (codes - 8) · scale + offset, as its two float64 parts [N, K]."""
    offset = q4.offset.double().repeat_interleave(GROUP_SIZE, 1)
    return q4.dequantize().double() - offset, offset


def test_packing_keeps_the_codes_scales_and_minimums(ops):
    rng = np.random.default_rng(0)
    weight = random_weight(rng, 48, 96, 0.1)
    q4 = Q4Weight.quantize(weight, ops)
    assert q4.packed.shape == (48, 48) and q4.scale.shape == q4.minimum.shape == (48, 3)
    assert q4.scale.dtype == q4.minimum.dtype == torch.float16
    assert torch.allclose(q4.dequantize(), weight, rtol=0, atol=1e-6)


def test_a_scale_beyond_fp16_is_refused(ops):
    # Q4_1 keeps each block's scale and minimum in fp16; a weight that needs more range is
    # not a Q4_1 layer, and silently turning its scale into inf would poison every output.
    weight = torch.zeros(16, 64)
    weight[3, 5] = 5e5                                       # scale 5e5 / 15 fits, minimum 0
    Q4Weight.quantize(weight, ops)
    weight[3, 6] = -1e5                                      # minimum -1e5: beyond 65504
    with pytest.raises(ValueError, match="fp16"):
        Q4Weight.quantize(weight, ops)


@pytest.mark.parametrize("rows", range(1, Q4_MAX_ROWS + 1))
def test_every_row_count_matches_float64_of_the_rounded_activations(ops, rows):
    rng = np.random.default_rng(rows)
    weight = random_weight(rng, 80, 160, 0.05)
    q4 = Q4Weight.quantize(weight, ops)
    x = torch.randn(rows, 160).to(torch.bfloat16)
    rounded, step = per_block_rounding(x)
    codes_part, offset_part = split(q4)
    # The codes meet the rounded activations; the offsets meet the exact block sums.
    exact = rounded @ codes_part.t() + x.double() @ offset_part.t()
    got = q4.matmul(x).double()
    # fp32 accumulation of 160 products, then one bf16 rounding of the result.
    scale = rounded.abs() @ codes_part.abs().t() + x.double().abs() @ offset_part.abs().t()
    assert ((got - exact).abs() <= exact.abs() * 2 ** -8 + scale * 1e-5).all()
    # And against the activations as given: within half a step each.
    truth = x.double() @ q4.dequantize().double().t()
    bound = (step / 2) @ codes_part.abs().t()
    assert ((got - truth).abs() <= bound + truth.abs() * 2 ** -8 + scale * 1e-5).all()


@pytest.mark.parametrize("spread", [1e-6, 300.0])
def test_subnormal_and_large_fp16_scales(ops, spread):
    # Scales below fp16's smallest normal (6.1e-5) and minimums up to -2,400: the fp16
    # conversion of every path (the scalar one by bits) must give the value Q4Weight holds.
    rng = np.random.default_rng(11)
    weight = random_weight(rng, 40, 96, spread)
    q4 = Q4Weight.quantize(weight, ops)
    assert (q4.scale.float() < 6.1e-5).any() if spread < 1 else (q4.minimum.float() < -1000).any()
    x = torch.randn(3, 96).to(torch.bfloat16)
    rounded, step = per_block_rounding(x)
    codes_part, offset_part = split(q4)
    exact = rounded @ codes_part.t() + x.double() @ offset_part.t()
    scale = rounded.abs() @ codes_part.abs().t() + x.double().abs() @ offset_part.abs().t()
    assert ((q4.matmul(x).double() - exact).abs() <= exact.abs() * 2 ** -8 + scale * 1e-5).all()


def test_the_whole_bf16_range_of_activations(ops):
    """Random bit patterns over every finite exponent: each block's scale follows its own
    magnitude, so tiny and huge blocks in one row are each within their own half step."""
    rng = np.random.default_rng(7)
    weight = random_weight(rng, 32, 64 * 32, 1e-3)
    q4 = Q4Weight.quantize(weight, ops)
    for _ in range(20):
        x = random_finite_bf16(rng, (3, 64 * 32))
        # Keep the products finite in fp32: |x| <= 1e30 with |w| <~ 0.02 and 2,048 terms.
        x = torch.where(x.float().abs() > 1e30, torch.zeros_like(x), x)
        rounded, step = per_block_rounding(x)
        w = q4.dequantize().double()
        codes_part, _ = split(q4)
        got = q4.matmul(x).double()
        truth = x.double() @ w.t()
        bound = (step / 2) @ codes_part.abs().t() + (x.double().abs() @ w.abs().t()) * 2 ** -7 + 1e-30
        assert torch.isfinite(got).all()
        assert ((got - truth).abs() <= bound).all()


def test_zero_blocks_and_non_finite_rows(ops):
    rng = np.random.default_rng(3)
    weight = random_weight(rng, 16, 64, 0.1)
    q4 = Q4Weight.quantize(weight, ops)
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    x[1, 5] = float("nan")
    x[2, 40] = float("inf")
    x[3, :32] = torch.linspace(-2, 2, 32)
    out = q4.matmul(x)
    assert out[0].eq(0).all()                          # all-zero row: exactly zero
    assert out[1].isnan().all() and out[2].isnan().all()   # as a float matmul would give
    assert torch.isfinite(out[3]).all()                # bystander rows are untouched
    expected = x[3:].double() @ weight.double().t()
    assert torch.allclose(out[3:].double(), expected, rtol=0.02, atol=0.02)


def test_refuses_shapes_it_has_no_instance_for(ops):
    q4 = Q4Weight.quantize(torch.zeros(16, 64), ops)
    for bad in (torch.zeros(Q4_MAX_ROWS + 1, 64, dtype=torch.bfloat16),
                torch.zeros(1, 96, dtype=torch.bfloat16), torch.zeros(1, 64)):
        with pytest.raises(ValueError):
            q4.matmul(bad)


def test_agrees_with_torchs_int4_kernel_on_the_packaged_layers(ops, loaded_model):
    """Both read the GGUF's Q4_1 codes; they differ in the activations' rounding (int16 per 32
    here, none there) and the scales' (fp16 as in the file here, bf16 there)."""
    torch.manual_seed(0)
    for layer in (0, 15, 29):
        for linear in (loaded_model.model.layers[layer].self_attn.qkv_proj,
                       loaded_model.model.layers[layer].mlp.down_proj):
            weight = linear.weight.detach()
            x = torch.randn(2, weight.shape[1]).to(torch.bfloat16)
            truth = x.double() @ weight.double().t()
            ours = Q4Weight.quantize(weight, ops).matmul(x).double()
            torchs = Int4Weight.quantize(weight).matmul(x).double()
            rel = lambda got: ((got - truth).norm() / truth.norm()).item()   # noqa: E731
            print(f"layer {layer} {tuple(weight.shape)}: relative error ours {rel(ours):.4f}, "
                  f"torch's int4 {rel(torchs):.4f}")
            assert rel(ours) < 0.005 and rel(torchs) < 0.005, (rel(ours), rel(torchs))
