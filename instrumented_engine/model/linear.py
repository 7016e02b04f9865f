"""Linear layers that pick their CPU kernel by the number of rows in the step.

No single weight format is fastest for every step (measured per CPU capability in
docs/reference.md, "Engine weight formats"; `cpu_formats.py` chooses them): weight-only int4 or
int8 (`quant.py`) reads a quarter or half of bf16's bytes and wins while a step has few rows
(decode); oneDNN's GEMM on a prepacked weight, bf16 where the CPU has AVX-512 BF16 and fp32
elsewhere, wins once the rows make the step compute-bound (prefill, big decode batches). So a
layer may hold both and choose per call. The dense `weight` stays the source of truth: CUDA and
the portable path use it with `F.linear`, and the parity tests read it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from instrumented_engine.model.cpu_formats import LowBit
from instrumented_engine.model.quant import GROUP_SIZE, Int4Weight, Int8Weight, Q4Weight

_PACKED_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _quantize(weight: torch.Tensor, tier: LowBit, fused) -> Int4Weight | Int8Weight | Q4Weight | None:
    """The weight in a tier's format, or None where that format cannot hold it: int4 needs
    its kernel's shapes, q4_1 the fused library and rows a multiple of the group; int8 runs
    small steps on the fused library's kernel where it has one."""
    if tier.format == "int4":
        return Int4Weight.quantize(weight) if Int4Weight.fits(weight) else None
    if tier.format == "q4_1":
        fits = fused is not None and weight.shape[1] % GROUP_SIZE == 0
        return Q4Weight.quantize(weight, fused) if fits else None
    return Int8Weight.quantize(weight, fused)


@dataclass(slots=True, frozen=True)
class CpuKernels:
    """The prepared forms of one weight: weight-only tiers for small steps, a prepacked dense
    weight for the rest; either may be absent."""

    packed: torch.Tensor | None                   # oneDNN's layout of the bf16 or fp32 weight
    packed_dtype: torch.dtype | None
    # (max_rows, weight) from the smallest steps up: a step takes the first tier it fits.
    tiers: tuple[tuple[int, Int4Weight | Int8Weight | Q4Weight], ...] = ()

    @classmethod
    def build(cls, weight: torch.Tensor, *, dense: str, low_bit: tuple[LowBit, ...] = (),
              fused=None) -> CpuKernels:
        """`dense`: "bf16" or "fp32" (oneDNN prepacked) or "dense" (none); `low_bit`: the
        weight-only tiers (`cpu_formats.LowBit`), smallest steps first; `fused`: the
        FusedCpuOps that run q4_1. A tier whose format cannot hold this weight is left out,
        and the next tier serves its steps."""
        weight = weight.detach()
        packed_dtype = _PACKED_DTYPES.get(dense)
        packed = (torch.ops.mkldnn._reorder_linear_weight(weight.to(packed_dtype), None)
                  if packed_dtype is not None else None)
        tiers = tuple((tier.max_rows, q) for tier in low_bit
                      if (q := _quantize(weight, tier, fused)) is not None)
        if packed is None and not tiers:
            raise ValueError("CpuKernels needs a prepacked or a weight-only form")
        return cls(packed, packed_dtype, tiers)

    @property
    def formats(self) -> tuple[str, ...]:
        dense = {torch.bfloat16: ("bf16",), torch.float32: ("fp32",)}.get(self.packed_dtype, ())
        return tuple(q.name for _, q in self.tiers) + dense

    def low_bit_for(self, rows: int) -> Int4Weight | Int8Weight | Q4Weight | None:
        """The weight-only form that serves a step of `rows` rows, or None for the dense one:
        the first tier the step fits, else the dense weight, else the last tier."""
        for max_rows, low_bit in self.tiers:
            if rows <= max_rows:
                return low_bit
        return self.tiers[-1][1] if self.packed is None else None

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype: the weight-only kernels compute on bf16
        activations, oneDNN in its weight's dtype."""
        low_bit = self.low_bit_for(x.shape[0])
        if low_bit is not None:
            # The dtype checks skip no-op `.to` calls: ~2 µs of dispatch each, where a whole
            # int4 decode matmul takes ~20 µs.
            out = low_bit.matmul(x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16))
        else:
            xp = x if x.dtype == self.packed_dtype else x.to(self.packed_dtype)
            out = torch.ops.mkldnn._linear_pointwise(xp, self.packed, None, "none", [], "")
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out if out.dtype == x.dtype else out.to(x.dtype)


class Linear(nn.Module):
    """`nn.Linear` (y = x Wᵀ + b) whose forward uses `CpuKernels` once `prepare` built them.

    >>> layer = Linear(32, 16)
    >>> _ = layer.weight.data.copy_(torch.arange(512.0).view(16, 32) / 512)
    >>> x = torch.ones(1, 32)
    >>> dense = layer(x)
    >>> layer.prepare(dense="fp32", low_bit=(LowBit("int4", 8),)); layer.kernels.formats
    ('int4', 'fp32')
    >>> torch.allclose(layer(x), dense, rtol=1e-2)
    True
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.kernels: CpuKernels | None = None
        # nn.Linear's own init, so a model built without a checkpoint (tests) is well scaled.
        bound = in_features ** -0.5
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def prepare(self, *, dense: str, low_bit: tuple[LowBit, ...] = (), fused=None) -> None:
        """Build the CPU fast paths from `weight`, once the weights are loaded (as in
        `CpuKernels.build`; "dense" without a weight-only tier = F.linear)."""
        self.kernels = (CpuKernels.build(self.weight, dense=dense, low_bit=low_bit, fused=fused)
                        if dense != "dense" or low_bit else None)

    @property
    def kernel_formats(self) -> tuple[str, ...]:
        """("int4", "bf16") with both fast paths; ("dense",) for F.linear on the weight."""
        return ("dense",) if self.kernels is None else self.kernels.formats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            return F.linear(x, self.weight, self.bias)
        return self.kernels(x, self.bias)
