"""Linear layers that pick their CPU kernel by the number of rows in the step.

On this kind of CPU (AVX-512 with bf16, no AMX) no single weight format is fastest for every
step. Measured over SmolLM2's layers on one core (docs/reference.md, "Engine weight formats"):
weight-only int4 or int8 (`quant.py`) reads a quarter or half of bf16's bytes and wins while a
step has few rows (decode); oneDNN's bf16 GEMM on a prepacked weight wins once the rows make
the step compute-bound (prefill, big decode batches). So a layer may hold both and choose per
call. The dense `weight` stays the source of truth: CUDA and fp32 use it with `F.linear`, and
the parity tests read it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from instrumented_engine.model.quant import Int4Weight, Int8Weight

QUANTIZED_FORMATS = {"int4": Int4Weight, "int8": Int8Weight}


@dataclass(slots=True, frozen=True)
class CpuKernels:
    """The prepared forms of one weight; either may be absent."""

    bf16_packed: torch.Tensor | None              # oneDNN's layout of the bf16 weight
    quantized: Int4Weight | Int8Weight | None     # used for steps of up to `max_rows` rows

    @classmethod
    def build(cls, weight: torch.Tensor, *, bf16: bool, quantized: str | None) -> CpuKernels:
        """`quantized`: "int4", "int8" or None. int4 needs the kernel's shapes (`Int4Weight.fits`);
        a weight that does not fit keeps bf16 only."""
        weight = weight.detach()
        packed = (torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), None)
                  if bf16 else None)
        if quantized == "int4" and not Int4Weight.fits(weight):
            quantized = None
        return cls(packed, QUANTIZED_FORMATS[quantized].quantize(weight) if quantized else None)

    @property
    def formats(self) -> tuple[str, ...]:
        low_bit = (self.quantized.name,) if self.quantized is not None else ()
        return low_bit + (("bf16",) if self.bf16_packed is not None else ())

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] in any float dtype -> [rows, out] in x's dtype, computed in bf16."""
        # The dtype checks skip two no-op `.to` calls per matmul: ~2 µs of dispatch each decode
        # layer, where the whole int4 matmul takes ~20 µs.
        x16 = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        low_bit = self.quantized
        if low_bit is not None and (x.shape[0] <= low_bit.max_rows or self.bf16_packed is None):
            out = low_bit.matmul(x16)
        else:
            out = torch.ops.mkldnn._linear_pointwise(x16, self.bf16_packed, None, "none", [], "")
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out if out.dtype == x.dtype else out.to(x.dtype)


class Linear(nn.Module):
    """`nn.Linear` (y = x Wᵀ + b) whose forward uses `CpuKernels` once `prepare` built them.

    >>> layer = Linear(32, 16)
    >>> _ = layer.weight.data.copy_(torch.arange(512.0).view(16, 32) / 512)
    >>> x = torch.ones(1, 32)
    >>> dense = layer(x)
    >>> layer.prepare(bf16=True, quantized="int4"); layer.kernels.formats
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

    def prepare(self, *, bf16: bool, quantized: str | None) -> None:
        """Build the CPU fast paths from `weight`, once the weights are loaded."""
        self.kernels = (CpuKernels.build(self.weight, bf16=bf16, quantized=quantized)
                        if bf16 or quantized else None)

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
