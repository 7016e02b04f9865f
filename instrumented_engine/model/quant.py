"""Weight-only quantization in the layouts torch's CPU kernels read: int4 in groups of 32 for the
decoder layers, int8 per output row for the output head.

Why re-quantize at all: the GGUF stores every linear weight as Q4_1 (per 32 weights a scale
`d` and a minimum `m`, w = q·d + m with q in 0..15), and llama.cpp's quantizer puts the group's
minimum at q = 0 and its maximum at q = 15. So min/max quantization of the dequantized weights
finds the same `d`, `m` and the same codes again: the 4-bit codes are the GGUF's own. torch's
int4 layout keeps the scale and offset in bf16 instead of fp16 (tests/engine/test_quant.py
measures both facts on the packaged model); the hand-written `Q4Weight` keeps the file's fp16.

The output head (the tied embedding) is Q8_0 in the GGUF: 8 bits per weight with a scale per 32.
`Int8Weight` keeps 8 bits but one scale per row, the layout `_weight_int8pack_mm` reads; the
head is the largest single matmul of a decode step (56 MB in bf16).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from instrumented_engine.model.cpu_fused import Q8_MAX_ROWS as _Q8_MAX_ROWS

GROUP_SIZE = 32
# torch's int4 kernel dequantizes as (q - 8) · scale + zero.
_KERNEL_OFFSET = 8
_INT8_MAX = 127


def quantize_groups(weight: torch.Tensor, group_size: int = GROUP_SIZE
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> codes uint8 [N, K] in 0..15, scale [N, K/g], minimum [N, K/g] (fp32),
    so that weight ≈ codes · scale + minimum per group.

    >>> codes, scale, minimum = quantize_groups(torch.tensor([[0.0, 1.5, 3.0, 7.5]]), 4)
    >>> codes.tolist(), scale.tolist(), minimum.tolist()
    ([[0, 3, 6, 15]], [[0.5]], [[0.0]])
    """
    rows, cols = weight.shape
    if cols % group_size:
        raise ValueError(f"in_features {cols} is not a multiple of the group size {group_size}")
    groups = weight.detach().float().reshape(rows, cols // group_size, group_size)
    minimum = groups.amin(-1)
    scale = (groups.amax(-1) - minimum) / 15
    # A constant group has scale 0: every code is 0 and the minimum carries the value.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((groups - minimum[..., None]) / safe[..., None]).round_().clamp_(0, 15)
    return codes.to(torch.uint8).reshape(rows, cols), scale, minimum


@dataclass(slots=True, frozen=True)
class Int4Weight:
    """A [N, K] weight packed for `torch._weight_int4pack_mm_for_cpu` (bf16 activations)."""

    packed: torch.Tensor            # the kernel's opaque int4 layout
    scale_and_zero: torch.Tensor    # [K/g, N, 2] bf16
    group_size: int
    name = "int4"

    @staticmethod
    def fits(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> bool:
        """The kernel's shape rules: out_features a multiple of 16, in_features of the group."""
        return weight.shape[0] % 16 == 0 and weight.shape[1] % group_size == 0

    @classmethod
    def quantize(cls, weight: torch.Tensor, group_size: int = GROUP_SIZE) -> Int4Weight:
        codes, scale, minimum = quantize_groups(weight, group_size)
        zero = minimum + _KERNEL_OFFSET * scale
        scale_and_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        return cls(packed, scale_and_zero, group_size)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> x · Wᵀ [M, N] bf16."""
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scale_and_zero)

    def dequantize(self) -> torch.Tensor:
        """The weight the kernel multiplies by, [N, K] fp32 (for tests): W · I."""
        eye = torch.eye(self.scale_and_zero.shape[0] * self.group_size, dtype=torch.bfloat16)
        return self.matmul(eye).float().t()


@dataclass(slots=True, frozen=True)
class Int8Weight:
    """A [N, K] weight as int8 codes per output row, w ≈ code · scale[row]. With `ops` (the
    FusedCpuOps; K a multiple of 32), steps of up to `cpu_fused.Q8_MAX_ROWS` rows run the
    hand-written `q8_matmul.c` (activations rounded to int16 per block of 32), ~3x torch's
    kernel at one row on two AVX-512 threads (docs/reference.md, "Engine weight formats");
    otherwise `torch.ops.aten._weight_int8pack_mm` (bf16 activations)."""

    codes: torch.Tensor             # [N, K] int8 in -127..127
    scale: torch.Tensor             # [N] bf16
    ops: object = None              # the FusedCpuOps that runs small steps, or None
    name = "int8"

    @classmethod
    def quantize(cls, weight: torch.Tensor, ops=None) -> Int8Weight:
        """Symmetric per-row quantization: the row's largest |w| maps to ±127. `ops` is kept
        only where its kernel can read the weight (K a multiple of 32).

        >>> w = Int8Weight.quantize(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
        >>> w.codes.tolist()
        [[64, -127, 32], [0, 0, 0]]
        >>> w.dequantize()[1].tolist()
        [0.0, 0.0, 0.0]
        """
        weight = weight.detach().float()
        scale = weight.abs().amax(-1) / _INT8_MAX
        # An all-zero row has scale 0: code 0 with any scale is exact, so divide by 1 instead.
        safe = torch.where(scale > 0, scale, torch.full_like(scale, 1 / _INT8_MAX))
        codes = (weight / safe[:, None]).round_().clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
        fits = weight.shape[1] % GROUP_SIZE == 0
        return cls(codes.contiguous(), safe.to(torch.bfloat16).contiguous(),
                   ops if fits else None)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> x · Wᵀ [M, N] bf16."""
        if self.ops is not None and 1 <= x.shape[0] <= _Q8_MAX_ROWS:
            return self.ops.q8_matmul(x, self.codes, self.scale)
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scale)

    def dequantize(self) -> torch.Tensor:
        """The weight the kernel multiplies by, [N, K] fp32 (for tests)."""
        return self.codes.float() * self.scale.float()[:, None]


@dataclass(slots=True, frozen=True)
class Q4Weight:
    """A [N, K] weight as the GGUF's Q4_1 blocks (codes 0..15, an fp16 scale and minimum per
    32, 20 bytes a block as in the file), for the hand-written `q4_matmul.c` (bf16 activations
    rounded to int16 per block of 32): steps of up to `cpu_fused.Q4_MAX_ROWS` rows
    (docs/reference.md, "Engine weight formats"). w = (code - 8) · scale + offset, offset =
    minimum + 8 · scale in fp32."""

    packed: torch.Tensor            # [N, K/2] uint8: per block, codes 0..15 low, 16..31 high
    scale: torch.Tensor             # [N, K/32] fp16
    minimum: torch.Tensor           # [N, K/32] fp16
    ops: object                     # the FusedCpuOps that runs it
    name = "q4_1"

    def __post_init__(self) -> None:
        # The layout the C kernel reads, checked once here rather than on every matmul.
        rows, half = self.packed.shape
        blocks = (rows, 2 * half // GROUP_SIZE)
        if (self.packed.dtype != torch.uint8 or (2 * half) % GROUP_SIZE
                or self.scale.shape != blocks or self.minimum.shape != blocks
                or self.scale.dtype != torch.float16 or self.minimum.dtype != torch.float16
                or not all(t.is_contiguous() for t in (self.packed, self.scale, self.minimum))):
            raise ValueError(f"Q4Weight: packed {tuple(self.packed.shape)} {self.packed.dtype}, "
                             f"scale {tuple(self.scale.shape)} {self.scale.dtype}, minimum "
                             f"{tuple(self.minimum.shape)} {self.minimum.dtype} are not the "
                             f"kernel's layout")

    @classmethod
    def quantize(cls, weight: torch.Tensor, ops) -> Q4Weight:
        """The weight's codes with its scale and minimum in fp16: exact for a GGUF's Q4_1
        layers, whose file stores them so (tests/engine/test_quant.py); a weight whose scale
        or minimum is beyond fp16's range is refused."""
        codes, scale, minimum = quantize_groups(weight, GROUP_SIZE)
        scale16, minimum16 = scale.half(), minimum.half()
        if not (torch.isfinite(scale16).all() and torch.isfinite(minimum16).all()):
            raise ValueError("Q4Weight: a block's scale or minimum is beyond fp16's range "
                             "(Q4_1 stores them in fp16)")
        blocks = codes.view(codes.shape[0], -1, 2, GROUP_SIZE // 2)
        packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(codes.shape[0], -1)
        return cls(packed.contiguous(), scale16.contiguous(), minimum16.contiguous(), ops)

    @property
    def offset(self) -> torch.Tensor:
        """[N, K/32] fp32: minimum + 8 · scale, as the kernel forms it (8 · scale is exact)."""
        return self.minimum.float() + _KERNEL_OFFSET * self.scale.float()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> x · Wᵀ [M, N] bf16."""
        return self.ops.q4_matmul(x, self.packed, self.scale, self.minimum)

    def codes(self) -> torch.Tensor:
        """[N, K] uint8 in 0..15 (for tests)."""
        lo, hi = self.packed & 15, self.packed >> 4
        rows = self.packed.shape[0]
        return torch.stack([lo.view(rows, -1, 16), hi.view(rows, -1, 16)], 2).view(rows, -1)

    def dequantize(self) -> torch.Tensor:
        """The weight in fp32, [N, K] (for tests)."""
        return ((self.codes().float() - _KERNEL_OFFSET)
                * self.scale.float().repeat_interleave(GROUP_SIZE, 1)
                + self.offset.repeat_interleave(GROUP_SIZE, 1))
