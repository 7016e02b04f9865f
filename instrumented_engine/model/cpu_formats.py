"""Which weight formats and activation dtype the engine uses on the CPU it runs on.

No single CPU plan is fastest, or even runnable, everywhere. What torch reports decides
(`CpuCapability.detect`), and `plan_cpu` is a pure function of that capability and the user's
`--dtype` / `--weight-format`, so every branch is unit-tested on any host with an injected
capability (tests/engine/test_cpu_formats.py). Measured per capability in docs/reference.md,
"Engine weight formats":

- **avx512_bf16** (torch's AVX512 kernels and the AVX-512 BF16 instructions): bf16 activations;
  the hand-written q4_1 matmul for decode steps of 1-2 rows, torch's weight-only int4 (both the
  GGUF's Q4_1 codes) up to 8 rows, and int8 for the head up to 4; oneDNN's prepacked bf16 GEMM
  for bigger steps; the fused C ops.
- **avx2** (no AVX-512 BF16, or torch capped at AVX2): bf16 stays the storage and activation
  dtype, since torch's weight-only kernels and the fused C ops read bf16 with cheap shifts; but
  bf16 GEMMs are emulated there (~10x fp32's time), so every GEMM that is not weight-only runs
  in fp32: oneDNN's prepacked fp32 weights for steps of more than 16 rows (4 for the head), and
  attention over the prompt (SDPA) upcast to fp32. Steps of 1-3 rows take the hand-written
  q4_1 matmul (`q4_matmul.c`: the GGUF's blocks, int16 activations per 32), where torch's int4
  kernel is compute-bound on AVX2; torch's int4 takes 4-16 rows, oneDNN fp32 more.
- **portable** (anything else, or without oneDNN): fp32 and plain `F.linear`, torch's ops. Slow,
  but it runs wherever torch runs, and it is the reference the parity tests compare against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from instrumented_engine.model.format_names import DTYPE_CHOICES, WEIGHT_FORMAT_CHOICES


class CpuFormatError(ValueError):
    """A format this CPU (or this torch build) cannot run; the message says what to use."""


@dataclass(slots=True, frozen=True)
class CpuCapability:
    """What torch reports about the CPU. `isa` is torch's kernel level
    (`torch.backends.cpu.get_cpu_capability()`: "AVX512", "AVX2", "DEFAULT", ...), which
    ATEN_CPU_CAPABILITY can lower; the flags come from torch's cpuinfo."""

    isa: str
    avx512_bf16: bool
    onednn: bool

    @classmethod
    def detect(cls) -> CpuCapability:
        return cls(isa=torch.backends.cpu.get_cpu_capability(),
                   avx512_bf16=bool(torch.cpu._is_avx512_bf16_supported()),
                   onednn=torch.backends.mkldnn.is_available())

    @property
    def path(self) -> str:
        """The plan's name: avx512_bf16, avx2 or portable."""
        if not self.onednn:
            return "portable"
        if self.isa in ("AVX512", "AMX") and self.avx512_bf16:
            return "avx512_bf16"
        if self.isa in ("AVX2", "AVX512", "AMX"):
            return "avx2"
        return "portable"

    @property
    def runs_bf16_gemm(self) -> bool:
        """oneDNN's bf16 GEMM runs natively (torch refuses it below AVX-512 BW/VL/DQ)."""
        return self.path == "avx512_bf16"


@dataclass(slots=True, frozen=True)
class LowBit:
    """A weight-only format and the largest step (rows) it serves; bigger steps take the
    dense format."""

    format: str
    max_rows: int


@dataclass(slots=True, frozen=True)
class CpuPlan:
    """Everything the loader needs to prepare the model on a CPU."""

    path: str                     # avx512_bf16 | avx2 | portable
    isa: str                      # torch's capability, as reported
    dtype: torch.dtype            # activations, norms, the KV cache
    dense: str                    # bf16 | fp32 | dense: the format of steps over max_rows
    layers: tuple[LowBit, ...]    # decoder layers' weight-only tiers, smallest steps first
    head: tuple[LowBit, ...]      # the output head's (a GGUF's Q8_0 embedding)
    fused_ops: bool               # the fused C norm / rope / decode-attention ops
    attention_dtype: torch.dtype  # SDPA's compute dtype (the fused decode kernel is fp32 inside)

    @property
    def weight_formats(self) -> tuple[str, ...]:
        """The decoder layers' formats, e.g. ("int4", "bf16"): the label a figure is tied to."""
        return tuple(tier.format for tier in self.layers) + (self.dense,)

    def describe(self) -> dict[str, object]:
        """The plan as /health, /v1/models and the start-up log show it."""
        return {"cpu_capability": self.isa, "cpu_path": self.path,
                "dtype": dtype_name(self.dtype), "weight_formats": list(self.weight_formats),
                "head_formats": [tier.format for tier in self.head] + [self.dense],
                "attention_dtype": dtype_name(self.attention_dtype),
                "fused_cpu_ops": self.fused_ops}


# The dtype names --dtype takes (format_names.DTYPE_CHOICES, less "auto"); the loader reads
# them too, for the GPU.
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
          "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16", as /v1/models shows it."""
    return str(dtype).removeprefix("torch.")

# Each path's measured plan (docs/reference.md, "Engine weight formats"). A crossover is the
# largest step where the weight-only kernel still beat the dense GEMM, one core:
#  - avx512_bf16, decoder layers: int4 11.6 ms vs bf16 ~12 ms over the 30 layers at 8 rows;
#    on two threads, the 30 layers' matmuls alone, q4_1 3.7 / 4.8 / 7.0 ms vs int4 4.0 / 4.7 /
#    5.5 at 1 / 2 / 3 rows (a tie at 2, where q4_1's raw call in decode_fast.py saves ~5 µs a
#    matmul), and a one-row decode step 6.07 vs 6.98 ms;
#    head [49152, 576]: int8 0.49 vs bf16 0.67 ms at 1 row, 0.84 vs 0.93 at 4, 3.8 vs 1.7 at 16.
#  - avx2 (torch and oneDNN capped at AVX2 on an AVX-512 EPYC), the 30 layers: int4 12.4 / 12.9
#    / 26.6 / 52.4 ms vs fp32 oneDNN 23.6 / 25.5 / 32.6 / 51.2 at 1 / 4 / 8 / 16 rows (int8
#    11.7 / 19.6 / 32.7 / 56.8), and the hand-written q4_1 (q4_matmul.c) 6.8 / 9.0 / 14.5 ms at
#    1 / 2 / 4 rows against torch's int4 12.9 / 12.8 / 13.4 in one run; head: int8 3.0 / 5.1 /
#    9.7 ms vs fp32 4.9 / 6.5 / 8.0 at 1 / 4 / 8. On the engine's two threads (wall time) the
#    compute-bound kernels gain on the memory-bound fp32 one, and the crossovers move: q4_1 4.0 /
#    5.4 / 6.7 / 8.4 ms vs int4 6.8 / 6.9 / 7.1 / 7.5 at 1 / 2 / 3 / 4 rows; int4 13.6 / 26.4 /
#    40.9 vs fp32 21.2 / 30.0 / 37.0 at 8 / 16 / 24; head int8 2.7 / 4.8 vs fp32 3.8 / 3.8 at 4 / 6.
#    The avx2 tiers follow the two-thread figures: that is what the engine runs.
_PLANS = {
    "avx512_bf16": dict(dtype=torch.bfloat16, dense="bf16",
                        layers=(LowBit("q4_1", 2), LowBit("int4", 8)),
                        head=(LowBit("int8", 4),), fused_ops=True,
                        attention_dtype=torch.bfloat16),
    "avx2": dict(dtype=torch.bfloat16, dense="fp32",
                 layers=(LowBit("q4_1", 3), LowBit("int4", 16)), head=(LowBit("int8", 4),),
                 fused_ops=True, attention_dtype=torch.float32),
    "portable": dict(dtype=torch.float32, dense="dense", layers=(), head=(),
                     fused_ops=False, attention_dtype=torch.float32),
}


def plan_cpu(capability: CpuCapability, dtype: str | torch.dtype = "auto",
             weight_format: str = "auto") -> CpuPlan:
    """The plan for this capability; `dtype` / `weight_format` other than "auto" force a part
    of it, and a part the CPU cannot run is refused with a message naming what to use.

    >>> avx2 = CpuCapability(isa="AVX2", avx512_bf16=False, onednn=True)
    >>> plan_cpu(avx2).weight_formats, plan_cpu(avx2).dtype
    (('q4_1', 'int4', 'fp32'), torch.bfloat16)
    >>> plan_cpu(avx2, weight_format="bf16")
    Traceback (most recent call last):
    ...
    instrumented_engine.model.cpu_formats.CpuFormatError: weight format 'bf16' needs oneDNN's bf16 GEMM, which needs AVX-512 BF16 (torch reports AVX2, avx512_bf16=False): use --weight-format auto (q4_1+int4+fp32 here), fp32 or dense
    """
    if weight_format not in WEIGHT_FORMAT_CHOICES:
        raise CpuFormatError(f"unknown weight format {weight_format!r}; use one of "
                             f"{', '.join(WEIGHT_FORMAT_CHOICES)}")
    base = dict(_PLANS[capability.path])
    if weight_format != "auto":
        base.update(dense=weight_format, layers=(), head=())
    if base["dense"] == "bf16" and not capability.runs_bf16_gemm:
        auto = plan_cpu(capability)
        raise CpuFormatError(
            f"weight format 'bf16' needs oneDNN's bf16 GEMM, which needs AVX-512 BF16 (torch "
            f"reports {capability.isa}, avx512_bf16={capability.avx512_bf16}): use "
            f"--weight-format auto ({'+'.join(auto.weight_formats)} here), fp32 or dense")
    if base["dense"] == "fp32" and not capability.onednn:
        raise CpuFormatError("weight format 'fp32' needs torch built with oneDNN (mkldnn), "
                             "which this torch is not: use --weight-format dense")
    if dtype != "auto":
        forced = dtype if isinstance(dtype, torch.dtype) else DTYPES.get(dtype)
        if forced is None:
            raise CpuFormatError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_CHOICES)}")
        if forced != base["dtype"]:
            # Another dtype than the plan's is the reference path (fp32: what the parity tests
            # compare against): F.linear and torch's ops, unless a weight format is forced too.
            base.update(dtype=forced, layers=(), head=(), fused_ops=False,
                        attention_dtype=forced if forced == torch.float32
                        else base["attention_dtype"],
                        dense=base["dense"] if weight_format != "auto" else "dense")
    return CpuPlan(path=capability.path, isa=capability.isa, **base)
