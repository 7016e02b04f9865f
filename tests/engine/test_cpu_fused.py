"""The fused C kernels (instrumented_engine/model/cpu_fused.{c,py}) against the torch ops they
replace, over bf16's whole range: every bit pattern (NaN, ±inf, subnormals, ±0) as well as
realistic activations, empty inputs and shapes that do not fit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from instrumented_engine.model import cpu_fused
from instrumented_engine.model.llama import apply_rope

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def ops() -> cpu_fused.FusedCpuOps:
    fused = cpu_fused.load()
    assert fused is not None, "the test machine has a C compiler (gcc is part of the set-up)"
    return fused


def bf16_from_bits(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16).copy()).view(BF16)


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in representable bf16 steps (sign-magnitude bits mapped onto a line)."""
    def ordered(t):
        bits = t.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)
    return (ordered(a) - ordered(b)).abs()


def assert_bits_equal(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Bit for bit, except that a NaN's payload is not compared (torch makes it canonical)."""
    assert torch.equal(ours.isnan(), theirs.isnan())
    keep = ~ours.isnan()
    assert torch.equal(ours[keep].view(torch.int16), theirs[keep].view(torch.int16))


def assert_same_specials(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """NaN where torch has NaN, the same infinities; -> the mask of finite values."""
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.equal(ours.isinf(), theirs.isinf())
    assert torch.equal(ours[ours.isinf()], theirs[theirs.isinf()])
    return ours.isfinite()


any_bits = st.integers(0, 0xFFFF)
realistic = st.floats(-64, 64, width=32).map(lambda f: int(np.float32(f).view(np.uint32)) >> 16)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 4), dim=st.sampled_from([1, 2, 17, 64, 576]),
       values=st.sampled_from([any_bits, realistic]), with_delta=st.booleans(), data=st.data())
def test_add_rms_norm_matches_torch(ops, rows, dim, values, with_delta, data):
    draw = lambda n: bf16_from_bits(np.array(data.draw(st.lists(values, min_size=n, max_size=n))))  # noqa: E731
    x = draw(rows * dim).view(rows, dim)
    delta = draw(rows * dim).view(rows, dim) if with_delta else None
    weight = draw(dim)
    expected_x = x + delta if with_delta else x.clone()
    expected = F.rms_norm(expected_x, (dim,), weight, 1e-5)
    x_after, normed = ops.add_rms_norm(x.clone(), delta, weight, 1e-5)
    # The residual add is one fp32 add rounded to nearest even, in torch as here: bit for bit.
    assert_bits_equal(x_after, expected_x)
    finite = assert_same_specials(normed, expected)
    # fp32 math rounded once here; torch may round twice and sums in another order.
    assert (ulps_apart(normed[finite], expected[finite]) <= 2).all()


def test_add_rms_norm_on_a_real_row_is_within_an_ulp_of_float64(ops):
    torch.manual_seed(0)
    x, delta, weight = (torch.randn(3, 576).mul(4).to(BF16), torch.randn(3, 576).to(BF16),
                        torch.rand(576).to(BF16))
    x_after, normed = ops.add_rms_norm(x.clone(), delta, weight, 1e-5)
    x64 = x_after.double()
    exact = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
    assert (ulps_apart(normed, exact.to(BF16)) <= 1).all()


def rope_inputs(tokens: int, nh: int, kvh: int, hd: int, bits,
                seed: int = 0) -> tuple[torch.Tensor, ...]:
    qkv = bf16_from_bits(bits((tokens, (nh + 2 * kvh) * hd)))
    # From the example's seed, not torch's global generator: a failing example must fail
    # again when hypothesis replays it.
    angle = torch.rand(tokens, 1, hd // 2, generator=torch.Generator().manual_seed(seed)) * 100
    cos = torch.cat([angle.cos()] * 2, -1).to(BF16)
    sin = torch.cat([-angle.sin(), angle.sin()], -1).to(BF16)
    return qkv, cos, sin


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(0, 5), heads=st.sampled_from([(3, 1), (9, 3), (4, 4)]),
       hd=st.sampled_from([2, 8, 64]), full_range=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_rope_store_kv_matches_torch(ops, tokens, heads, hd, full_range, seed):
    nh, kvh = heads
    rng = np.random.default_rng(seed)
    bits = ((lambda shape: rng.integers(0, 0x10000, shape)) if full_range else
            (lambda shape: np.float32(rng.normal(0, 3, shape)).view(np.uint32) >> 16))
    qkv, cos, sin = rope_inputs(tokens, nh, kvh, hd, bits, seed)
    num_blocks, block_size = 4, 4
    slots = torch.from_numpy(rng.permutation(num_blocks * block_size)[:tokens].copy())
    k_cache, v_cache = (torch.zeros(num_blocks, block_size, kvh, hd, dtype=BF16) for _ in "kv")
    ours = qkv.clone()
    ops.rope_store_kv(ours, nh, kvh, cos, sin, slots, k_cache, v_cache)

    heads_qk = qkv[:, :(nh + kvh) * hd].view(tokens, nh + kvh, hd)
    # The same fp32 formula, rounded once: bit for bit (the C is built without FMA contraction).
    swapped = heads_qk.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    once = (heads_qk.float() * cos.float() + swapped.float() * sin.float()).to(BF16)
    rotated = ours[:, :(nh + kvh) * hd].view(tokens, nh + kvh, hd)
    assert_bits_equal(rotated, once)
    # The model's torch path (apply_rope: x·cos rounded, then addcmul rounded) agrees to the
    # two paths' rounding errors: u|x·cos| + u|sum| for it, u|sum| for ours, with bf16's
    # unit roundoff u = 2^-8 and |sum| <= scale, so at most 3u·scale apart (2u was exceeded
    # when x·cos dominates); and where a rounding lands among the subnormals, its error is
    # absolute, half their spacing 2^-133 each: 3 * 2^-134 more. (Checked over 3,000 seeds
    # of the full bit range: nothing beyond; 15u relative at subnormal results without it.)
    reference = apply_rope(heads_qk, cos, sin)
    finite = assert_same_specials(rotated, reference) & (heads_qk.float() * cos.float()).isfinite()
    scale = (heads_qk.float() * cos.float()).abs() + (swapped.float() * sin.float()).abs()
    bound = scale * 3 * 2 ** -8 + 3 * 2 ** -134
    assert ((rotated.float() - reference.float()).abs() <= bound)[finite].all()
    # v is untouched; k (rotated) and v land in their slots, as index_copy_ would put them.
    assert torch.equal(ours[:, (nh + kvh) * hd:].view(torch.int16),
                       qkv[:, (nh + kvh) * hd:].view(torch.int16))
    expected_k, expected_v = (torch.zeros(num_blocks * block_size, kvh, hd, dtype=BF16) for _ in "kv")
    expected_k.index_copy_(0, slots, rotated[:, nh:])
    expected_v.index_copy_(0, slots, ours[:, (nh + kvh) * hd:].view(tokens, kvh, hd))
    assert torch.equal(k_cache.view(-1, kvh, hd).view(torch.int16), expected_k.view(torch.int16))
    assert torch.equal(v_cache.view(-1, kvh, hd).view(torch.int16), expected_v.view(torch.int16))


def test_wrong_dtype_layout_or_shape_is_a_clear_error(ops):
    x = torch.zeros(2, 8, dtype=BF16)
    with pytest.raises(ValueError, match="contiguous bf16 CPU"):
        ops.add_rms_norm(x.float(), None, torch.ones(8, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="contiguous bf16 CPU"):
        ops.add_rms_norm(torch.zeros(8, 2, dtype=BF16).t(), None, torch.ones(8, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="does not match x"):
        ops.add_rms_norm(x, torch.zeros(1, 8, dtype=BF16), torch.ones(8, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="hidden size"):
        ops.add_rms_norm(x, None, torch.ones(7, dtype=BF16), 1e-5)
    qkv, cos, sin = rope_inputs(2, 3, 1, 8, lambda shape: np.zeros(shape, np.uint32))
    cache = torch.zeros(2, 4, 1, 8, dtype=BF16)
    with pytest.raises(ValueError, match="do not fit"):
        ops.rope_store_kv(qkv, 4, 1, cos, sin, torch.tensor([0, 1]), cache, cache.clone())
    with pytest.raises(ValueError, match="do not fit"):
        ops.rope_store_kv(qkv, 3, 1, cos, sin, torch.tensor([0, 1], dtype=torch.int32), cache, cache.clone())


def test_a_missing_compiler_leaves_the_torch_ops(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="no C compiler"):
        cpu_fused.build(compiler="no-such-cc-on-this-machine")
    built = cpu_fused.build()
    assert built.parent == tmp_path / "ttftscope" and built.exists()
    assert cpu_fused.build() == built       # cached: the same key, no second build


def reference_attention(q, k_cache, v_cache, tables, lens) -> torch.Tensor:
    """float64, one sequence at a time, over exactly its first lens[s] cached positions."""
    seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty(seqs, num_heads, head_dim, dtype=torch.float64)
    for s in range(seqs):
        slots = [int(tables[s, p // block_size]) * block_size + p % block_size for p in range(int(lens[s]))]
        k = k_cache.view(-1, num_kv_heads, head_dim)[slots].double().transpose(0, 1)   # [kvh, L, hd]
        v = v_cache.view(-1, num_kv_heads, head_dim)[slots].double().transpose(0, 1)
        qs = q[s].double().view(num_kv_heads, -1, head_dim)                          # [kvh, g, hd]
        weights = torch.softmax(qs @ k.transpose(1, 2) * head_dim ** -0.5, dim=-1)
        out[s] = (weights @ v).reshape(num_heads, head_dim)
    return out


def attention_inputs(rng, seqs, heads, head_dim, block_size, scale=1.0):
    num_heads, num_kv_heads = heads
    max_blocks = 6
    num_blocks = seqs * max_blocks + 1
    tables = torch.from_numpy(rng.permutation(num_blocks)[:seqs * max_blocks].reshape(seqs, max_blocks).copy())
    lens = torch.from_numpy(rng.integers(1, max_blocks * block_size + 1, seqs))
    def normal(*shape):
        return torch.from_numpy(rng.normal(0, scale, shape).astype(np.float32)).to(BF16)
    # q is a strided view, as in the model (a slice of the qkv projection's rows).
    qkv = normal(seqs, (num_heads + 2 * num_kv_heads) * head_dim)
    q = qkv[:, :num_heads * head_dim].view(seqs, num_heads, head_dim)
    k_cache = normal(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = normal(num_blocks, block_size, num_kv_heads, head_dim)
    return q, k_cache, v_cache, tables, lens


@settings(max_examples=40, deadline=None)
@given(seqs=st.integers(1, 5), heads=st.sampled_from([(9, 3), (8, 2), (4, 4), (16, 2)]),
       head_dim=st.sampled_from([64, 128]), block_size=st.sampled_from([1, 4, 16]),
       scale=st.sampled_from([0.1, 1.0, 8.0]), seed=st.integers(0, 2**32 - 1))
def test_paged_decode_attention_matches_float64(ops, seqs, heads, head_dim, block_size, scale, seed):
    from instrumented_engine.model.attention import _decode_attention_cpu, _gather
    rng = np.random.default_rng(seed)
    q, k_cache, v_cache, tables, lens = attention_inputs(rng, seqs, heads, head_dim, block_size, scale)
    ours = ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, int(lens.max()))
    exact = reference_attention(q, k_cache, v_cache, tables, lens)
    # fp32 scores and softmax, one rounding at the end: half a bf16 ulp (2^-9 relative; 2^-8
    # allowed), plus fp32 accumulation error, which where terms cancel is relative to the
    # values' scale, not to the (small) result.
    bound = exact.abs() * 2 ** -8 + v_cache.abs().max().double() * 2 ** -16
    assert ((ours.double() - exact).abs() <= bound).all()
    # And never less accurate than the torch path it replaces (gather + matmuls or SDPA).
    keys = torch.arange(tables.shape[1] * block_size)
    bias = torch.zeros(seqs, keys.numel(), dtype=BF16).masked_fill_(keys[None] >= lens[:, None], float("-inf"))
    theirs = _decode_attention_cpu(q, _gather(k_cache, tables), _gather(v_cache, tables), bias[:, None, None])
    assert (ours.double() - exact).abs().max() <= (theirs.double() - exact).abs().max() + 1e-6


def test_a_nan_in_one_sequences_cache_stays_in_that_sequence(ops):
    rng = np.random.default_rng(7)
    q, k_cache, v_cache, tables, lens = attention_inputs(rng, 3, (9, 3), 64, 4)
    clean = ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, int(lens.max()))
    k_cache.view(-1, 3, 64)[int(tables[1, 0]) * 4, 0, 5] = float("nan")   # seq 1, position 0, kv head 0
    v_cache.view(-1, 3, 64)[int(tables[1, 0]) * 4, 2, 0] = float("inf")   # seq 1, position 0, kv head 2
    dirty = ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, int(lens.max()))
    assert torch.equal(dirty[[0, 2]], clean[[0, 2]])                      # other sequences: untouched
    assert dirty[1, :3].isnan().all()                                     # kv head 0 of seq 1: NaN
    assert dirty[1, 6:, 0].isinf().all()                                  # kv head 2: inf where v is
    assert torch.equal(dirty[1, 6:, 1:], clean[1, 6:, 1:])
    assert torch.equal(dirty[1, 3:6], clean[1, 3:6])                      # its kv head 1: untouched


def test_decode_attention_rejects_shapes_it_has_no_instance_for(ops):
    q = torch.zeros(1, 4, 32, dtype=BF16)
    cache = torch.zeros(2, 4, 2, 32, dtype=BF16)
    assert not ops.decode_attention_fits(4, 2, 32) and ops.decode_attention_fits(9, 3, 64)
    with pytest.raises(ValueError, match="do not fit"):
        ops.paged_decode_attention(q, cache, cache, torch.zeros(1, 2, dtype=torch.int64),
                                   torch.ones(1, dtype=torch.int64), 1)


def test_an_unusable_cache_folder_falls_back_to_the_temporary_directory(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder's parent should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(cpu_fused.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    built = cpu_fused.build()
    assert built.parent.parent == tmp_path / "tmp" and built.exists()


@pytest.mark.parametrize("up_values", ["realistic", "every_pattern"])
def test_silu_mul_matches_torch_over_every_gate(ops, up_values):
    """Every bf16 bit pattern as a gate (NaN, ±inf, subnormals, ±0) against torch's
    `F.silu(gate) * up`: the same specials, and finite values within one bf16 step (the
    exponential is libm's here and Sleef's there; each result is rounded the same way)."""
    rng = np.random.default_rng(5)
    gate = bf16_from_bits(np.arange(1 << 16)).view(2, -1)                      # [2, 32768]
    if up_values == "realistic":
        up = torch.from_numpy(rng.normal(0, 2, gate.shape).astype(np.float32)).to(BF16)
    else:
        up = bf16_from_bits(rng.permutation(1 << 16)).view(2, -1)
    ours = ops.silu_mul(torch.cat([gate, up], dim=1))
    theirs = F.silu(gate) * up
    finite = assert_same_specials(ours, theirs)
    assert (ulps_apart(ours[finite], theirs[finite]) <= 1).all()
    # Mostly the very same bits: a difference needs the two exponentials to straddle a
    # bf16 rounding boundary.
    assert (ulps_apart(ours[finite], theirs[finite]) == 0).float().mean() > 0.99


def test_silu_mul_refuses_an_odd_width(ops):
    with pytest.raises(ValueError):
        ops.silu_mul(torch.zeros(1, 7, dtype=BF16))
    with pytest.raises(ValueError):
        ops.silu_mul(torch.zeros(1, 8))
