"""Engine configuration: one frozen value, validated once."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Knobs for the scheduler, the KV cache and the device.

    >>> EngineConfig(max_num_batched_tokens=256).block_size
    16
    """

    model: str | None = None           # GGUF file or HF directory; None = the packaged SmolLM2
    block_size: int = 16                # tokens per KV block
    num_kv_blocks: int = 1024           # paged KV cache size (x block_size tokens)
    max_num_batched_tokens: int = 512   # chunked-prefill token budget per step
    max_num_seqs: int = 64              # running sequences per step
    max_model_len: int | None = None    # None = the model's own context length
    enable_prefix_caching: bool = True
    device: str = "auto"                # "auto" = cuda when available, else cpu
    dtype: str = "auto"                 # "auto" = the CPU plan's (model/cpu_formats.py); bf16 on GPU
    weight_format: str = "auto"         # CPU matmul kernels: auto | bf16 | fp32 | dense
    num_threads: int | None = None      # torch intra-op threads on CPU; None = torch default

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
