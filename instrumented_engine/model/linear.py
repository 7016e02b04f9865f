"""Linear layers that pick their CPU kernel by the number of rows in the step.

On this kind of CPU (AVX-512 with bf16, no AMX) no single weight format is fastest for every
step. Measured over SmolLM2's 30 layers on one core (docs/reference.md, "Engine weight
formats"): int4 weight-only (`_weight_int4pack_mm_for_cpu`) reads a quarter of bf16's bytes
and wins while a step has few rows (decode); oneDNN's bf16 GEMM on a prepacked weight wins once
the rows make the step compute-bound (prefill, big decode batches). So a layer may hold both
and choose per call. The dense `weight` stays the source of truth: CUDA and fp32 use it with
`F.linear`, and the parity tests read it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from instrumented_engine.model.quant import Int4Weight

# Up to this many rows take the int4 kernel; more take oneDNN bf16. The crossover measured on
# one core over the 30 layers: int4 11.6 ms, bf16 ~12 ms at 8 rows (docs/reference.md).
INT4_MAX_ROWS = 8


@dataclass(slots=True, frozen=True)
class CpuKernels:
    """The prepared forms of one weight; either may be absent."""

    bf16_packed: torch.Tensor | None    # oneDNN's layout of the bf16 weight
    int4: Int4Weight | None

    @classmethod
    def build(cls, weight: torch.Tensor, *, bf16: bool, int4: bool) -> CpuKernels:
        weight = weight.detach()
        packed = (torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), None)
                  if bf16 else None)
        int4 = int4 and Int4Weight.fits(weight)
        return cls(packed, Int4Weight.quantize(weight) if int4 else None)

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(name for name, form in (("int4", self.int4), ("bf16", self.bf16_packed))
                     if form is not None)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] in any float dtype -> [rows, out] in x's dtype, computed in bf16."""
        x16 = x.to(torch.bfloat16)
        if self.int4 is not None and (x.shape[0] <= INT4_MAX_ROWS or self.bf16_packed is None):
            out = self.int4.matmul(x16)
        else:
            out = torch.ops.mkldnn._linear_pointwise(x16, self.bf16_packed, None, "none", [], "")
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.to(x.dtype)


class Linear(nn.Module):
    """`nn.Linear` (y = x Wᵀ + b) whose forward uses `CpuKernels` once `prepare` built them.

    >>> layer = Linear(32, 16)
    >>> _ = layer.weight.data.copy_(torch.arange(512.0).view(16, 32) / 512)
    >>> x = torch.ones(1, 32)
    >>> dense = layer(x)
    >>> layer.prepare(bf16=True, int4=True); layer.kernels.formats
    ('int4', 'bf16')
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

    def prepare(self, *, bf16: bool, int4: bool) -> None:
        """Build the CPU fast paths from `weight`, once the weights are loaded."""
        self.kernels = CpuKernels.build(self.weight, bf16=bf16, int4=int4) if bf16 or int4 else None

    @property
    def kernel_formats(self) -> tuple[str, ...]:
        """("int4", "bf16") with both fast paths; the weight's dtype without any."""
        if self.kernels is None:
            return (str(self.weight.dtype).removeprefix("torch."),)
        return self.kernels.formats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            return F.linear(x, self.weight, self.bias)
        return self.kernels(x, self.bias)
