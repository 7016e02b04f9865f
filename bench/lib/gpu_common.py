"""What bench/gpu_check.py's sections share: the run's sizes (`Plan`), the table's rows, the
models' shapes, the devices' peaks and the targets."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from instrumented_engine.model.llama import ModelConfig

# NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200, H200 SXM column): BF16 Tensor Core
# 1,979 TFLOPS "with sparsity", i.e. 989 TFLOP/s dense; GPU memory bandwidth 4.8 TB/s (HBM3e).
H200_PEAK_BF16_FLOP_S = 989e12
H200_PEAK_HBM_BYTES_S = 4.8e12
# NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100, H100 SXM column): the same 1,979
# TFLOPS with sparsity; 3.35 TB/s (HBM3). torch names that card "NVIDIA H100 80GB HBM3".
H100_SXM_PEAK_HBM_BYTES_S = 3.35e12
MFU_TARGET = 0.50
MBU_TARGET = 0.70
STAGE_TARGET = 0.90

LLAMA_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_layers=32, num_heads=32, num_kv_heads=8, rope_theta=500000.0,
                       max_position_embeddings=8192)
TINY = ModelConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_layers=2,
                   num_heads=4, num_kv_heads=2, max_position_embeddings=512)
BLOCK_SIZE = 16

Row = dict   # {"section", "check", "value", "target", "verdict"}


def row(section: str, check: str, value: str, target: str = "", verdict: str = "info") -> Row:
    return {"section": section, "check": check, "value": value, "target": target,
            "verdict": verdict}


@dataclasses.dataclass
class Plan:
    """Sizes of one run: the real ones, or --tiny's (seconds on two CPU cores)."""

    device: torch.device
    dtype: torch.dtype
    parity_steps: int
    stage_prompt_tokens: int
    stage_trials: int
    speed_config: ModelConfig
    speed_prompt_tokens: int
    speed_repeats: int
    decode_repeats: int
    busy_matmul_size: int
    model_path: str | None = None   # None: the packaged SmolLM2 (loader.load_model)
    graph_batches: tuple[int, ...] = (16, 64)   # batched decode with CUDA graphs
    graph_context: int = 512        # each of those sequences' context

    @classmethod
    def make(cls, device: str, tiny: bool, model_path: str | None = None) -> "Plan":
        dev = torch.device(device)
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        if tiny:
            return cls(dev, dtype, 4, 96, 2, TINY, 64, 2, 4, 256, model_path, graph_context=32)
        return cls(dev, dtype, 16, 2048, 3, LLAMA_8B, 2048, 5, 30, 8192, model_path)


def sync_for(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE) + 1


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def peaks_for(device: torch.device) -> tuple[str, float, float] | None:
    """(card, dense bf16 FLOP/s, memory bytes/s) of a card whose datasheet is quoted above;
    None elsewhere (the CPU, another card): rates are then printed without a ratio.

    >>> peaks_for(torch.device("cpu")) is None
    True
    """
    name = device_name(device)
    if "H200" in name:
        return "H200", H200_PEAK_BF16_FLOP_S, H200_PEAK_HBM_BYTES_S
    if "H100" in name and "HBM3" in name:
        return "H100 SXM", H200_PEAK_BF16_FLOP_S, H100_SXM_PEAK_HBM_BYTES_S
    return None
