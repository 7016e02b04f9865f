"""bench/gpu_check.py's speed section: an 8B-shaped Llama (Llama 3 8B's shape) with random
bf16 weights made on the device, through `ModelRunner`, every step eager (the generic
forward, no CUDA graph): prefill MFU and batch-1 decode MBU, and how busy the device is in
one decode step. The graphs section (`gpu_graphs.py`) reuses the model it leaves in `state`."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from bench.lib.gpu_common import (
    BLOCK_SIZE,
    LLAMA_8B,
    MBU_TARGET,
    MFU_TARGET,
    Plan,
    Row,
    blocks_for,
    device_name,
    dtype_name,
    peaks_for,
    row,
    sync_for,
)
from bench.model_speed import timed_ms
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner
from instrumented_engine.model.llama import LlamaForCausalLM, ModelConfig
from instrumented_engine.model.loader import LoadedModel


def random_llama(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """The model built on the meta device (no memory), then materialised on `device` with
    random weights made there: an 8B model never passes through host memory."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:   # std 0.02 like transformers' init: activations stay finite through 32 layers
                param.normal_(0.0, 0.02, generator=generator)
    model.init_rope(device)
    model = model.eval().requires_grad_(False)
    values = {"name": "random-llama", "config": config, "model": model, "tokenizer": None,
              "chat_template": None, "eos_token_ids": (), "bos_token_id": None,
              "max_model_len": config.max_position_embeddings, "device": device, "dtype": dtype,
              "num_params": sum(p.numel() for p in model.parameters())}
    # Fields LoadedModel may gain later keep their defaults (else None): ModelRunner reads
    # config, model, device and dtype.
    return LoadedModel(**{f.name: values[f.name] if f.name in values else
                          (f.default if f.default is not dataclasses.MISSING else None)
                          for f in dataclasses.fields(LoadedModel)})


def decode_bytes(loaded: LoadedModel, context_tokens: int) -> int:
    """Bytes one batch-1 decode step must read: every parameter except the embedding table
    (one row of it is gathered; when tied, the same matrix is read whole as the lm_head),
    plus K and V of `context_tokens` positions in every layer."""
    cfg, model = loaded.config, loaded.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        total -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    element = torch.empty((), dtype=loaded.dtype).element_size()
    kv = 2 * cfg.num_layers * context_tokens * cfg.num_kv_heads * cfg.head_dim * element
    return total + kv


def section_speed(plan: Plan, state: dict) -> list[Row]:
    from instrumented_engine.model.flops import chunk_flops

    dtype = torch.bfloat16 if plan.device.type == "cuda" else plan.dtype
    loaded = random_llama(plan.speed_config, plan.device, dtype)
    n = plan.speed_prompt_tokens
    runner = ModelRunner(loaded, num_kv_blocks=blocks_for(n + 2), block_size=BLOCK_SIZE)
    table = list(range(runner.num_kv_blocks))
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(100, plan.speed_config.vocab_size, (n,), generator=generator).tolist()
    sync = sync_for(plan.device)
    prefill = [ForwardItem(prompt, 0, table, True)]
    prefill_s = timed_ms(lambda: runner.execute(prefill), plan.speed_repeats, sync) / 1e3
    runner.execute(prefill)                       # the cache holds the prompt's K/V
    decode = [ForwardItem([7], n, table, True)]   # rewrites one slot: the context stays n + 1
    decode_s = timed_ms(lambda: runner.execute(decode), plan.decode_repeats, sync) / 1e3
    logits = runner.execute(decode)
    if not bool(torch.isfinite(logits).all()):
        raise FloatingPointError("the random model's logits are not finite")
    busy_s, kernels = device_busy(lambda: runner.execute(decode), plan.device)

    flops = chunk_flops(plan.speed_config, n, 0, 1)
    nbytes = decode_bytes(loaded, n + 1)
    flop_s, bytes_s = flops / prefill_s, nbytes / decode_s
    peaks = peaks_for(plan.device)
    shape = (f"{'8B-shaped' if plan.speed_config == LLAMA_8B else 'tiny'} Llama, "
             f"{loaded.num_params / 1e6:,.1f} M params, {dtype_name(dtype)}")
    rows = [row("speed", "model", shape + f" on {device_name(plan.device)}")]
    if peaks is not None:
        _, peak_flop_s, peak_bytes_s = peaks
        mfu, mbu = flop_s / peak_flop_s, bytes_s / peak_bytes_s
        rows += [row("speed", f"prefill MFU, {n} tokens",
                     f"{mfu * 100:.1f} % ({prefill_s * 1e3:.1f} ms, {flop_s / 1e12:.0f} TFLOP/s "
                     f"of {peak_flop_s / 1e12:.0f})",
                     f">= {MFU_TARGET * 100:.0f} %", "met" if mfu >= MFU_TARGET else "missed"),
                 row("speed", f"decode MBU, batch 1 @ {n + 1} ctx",
                     f"{mbu * 100:.1f} % ({decode_s * 1e3:.2f} ms/token, {bytes_s / 1e12:.2f} TB/s "
                     f"of {peak_bytes_s / 1e12:.2f})",
                     f">= {MBU_TARGET * 100:.0f} %", "met" if mbu >= MBU_TARGET else "missed")]
    else:   # no datasheet quoted for this device: a ratio would mean nothing here
        rows += [row("speed", f"prefill, {n} tokens",
                     f"{prefill_s * 1e3:.1f} ms, {flop_s / 1e12:.3f} TFLOP/s (no peak for this device)",
                     f">= {MFU_TARGET * 100:.0f} % of an H200", "n/a"),
                 row("speed", f"decode, batch 1 @ {n + 1} ctx",
                     f"{decode_s * 1e3:.2f} ms/token, {bytes_s / 1e9:.2f} GB/s (no peak for this device)",
                     f">= {MBU_TARGET * 100:.0f} % of an H200", "n/a")]
    # A decode step that misses its bandwidth either runs slow kernels or leaves the device
    # idle between them while the host launches the next: this row tells which.
    rows.append(row("speed", "device busy in one decode step",
                    f"{busy_s * 1e3:.2f} of {decode_s * 1e3:.2f} ms "
                    f"({busy_s / decode_s * 100:.0f} %), {kernels} kernels"
                    if plan.device.type == "cuda" else "no device timeline on the cpu"))
    del runner
    state["speed_model"] = loaded      # for the graphs section, which frees it
    return rows


def device_busy(step: Callable[[], object], device: torch.device) -> tuple[float, int]:
    """(seconds the device spent in kernels and copies, number of them) during one call of
    `step`, from torch.profiler's device timeline; (0, 0) on the CPU, which has none."""
    if device.type != "cuda":
        return 0.0, 0
    from torch.profiler import ProfilerActivity, profile

    sync = sync_for(device)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    # The device's own events only: an aten op's row carries its kernels' time as well, so
    # summing every row would count each kernel twice.
    kernels = [event for event in prof.events()
               if event.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(event.time_range.elapsed_us() for event in kernels)
    count = len(kernels)
    return busy_us / 1e6, count

