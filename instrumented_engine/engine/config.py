"""Engine configuration: one frozen value, validated once."""
from __future__ import annotations

from dataclasses import dataclass

from instrumented_engine.engine.step_log import DEFAULT_STEP_LOG_SIZE


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
    # Long prompts share the step (docs/architecture.md, "Long prompts share the step"):
    long_prefill_token_threshold: int = 256  # more uncomputed tokens = long: capped; 0 = off
    max_num_partial_prefills: int = 2   # sequences a step may leave mid-prefill
    max_long_partial_prefills: int = 1  # of those, long ones
    max_model_len: int | None = None    # None = the model's own context length
    enable_prefix_caching: bool = True
    device: str = "auto"                # "auto" = cuda when available, else cpu
    dtype: str = "auto"                 # "auto" = the CPU plan's (model/cpu_formats.py); bf16 on GPU
    weight_format: str = "auto"         # CPU matmul kernels: auto | bf16 | fp32 | dense
    num_threads: int | None = None      # torch intra-op threads on CPU; None = torch default
    step_log_size: int = DEFAULT_STEP_LOG_SIZE  # forward passes kept (step_log.py); 0: none
    # CUDA only: True = every decode step eager, no CUDA graphs (vLLM's --enforce-eager;
    # engine/decode_graphs.py). The CPU never captures, whatever this says.
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0: off), "
                             f"got {self.long_prefill_token_threshold}")
        if not 1 <= self.max_long_partial_prefills <= self.max_num_partial_prefills:
            raise ValueError(
                "need 1 <= max_long_partial_prefills <= max_num_partial_prefills, got "
                f"{self.max_long_partial_prefills} and {self.max_num_partial_prefills}")
        if self.step_log_size < 0:
            raise ValueError(f"step_log_size must be >= 0, got {self.step_log_size}")
