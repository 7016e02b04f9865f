"""bench/gpu_check.py's graphs section: the decode step as CUDA graphs
(`instrumented_engine/engine/decode_graphs.py`) on the 8B-shaped Llama of the speed section.

One `ModelRunner` with the buckets for batch 1 at the speed section's context and for
`plan.graph_batches` sequences at `plan.graph_context`: every step is run eagerly once (the
warm-up), then the buckets are captured; the capture's time and memory are a row. Each
decode is then timed with the graphs on and, the same runner with its graphs set aside,
off: batch-1 MBU (target 70 % of the card's bandwidth), the device time of one replay from
the CUDA events around it against the step's wall time, tokens/s at each batch, and the
largest logit difference between the two paths. On the CPU nothing is captured: the same
buckets run the fixed-shape forward eagerly, so every line of this section runs there too.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from bench.lib.gpu_common import (
    BLOCK_SIZE,
    MBU_TARGET,
    Plan,
    Row,
    blocks_for,
    peaks_for,
    row,
    sync_for,
)
from bench.lib.gpu_speed import decode_bytes, random_llama
from bench.model_speed import timed_ms
from instrumented_engine.engine.decode_graphs import GraphPlan
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner


@contextlib.contextmanager
def graphs_off(runner: ModelRunner) -> Iterator[None]:
    """The runner's steps take the generic forward (as with --enforce-eager) for a while."""
    graphs, runner.decode_graphs = runner.decode_graphs, None
    try:
        yield
    finally:
        runner.decode_graphs = graphs


def bandwidth_cells(nbytes: int, step_s: float, device: torch.device) -> tuple[str, float | None]:
    """'x % (y TB/s of z)' against the card's peak, or 'y GB/s' without one; and the ratio."""
    peaks = peaks_for(device)
    if peaks is None:
        return f"{nbytes / step_s / 1e9:.2f} GB/s (no peak for this device)", None
    ratio = nbytes / step_s / peaks[2]
    return (f"{ratio * 100:.1f} % ({nbytes / step_s / 1e12:.2f} TB/s of "
            f"{peaks[2] / 1e12:.2f})"), ratio


def section_graphs(plan: Plan, state: dict) -> list[Row]:
    dtype = torch.bfloat16 if plan.device.type == "cuda" else plan.dtype
    loaded = state.pop("speed_model", None) or random_llama(plan.speed_config, plan.device, dtype)
    n, ctx, batches = plan.speed_prompt_tokens, plan.graph_context, plan.graph_batches
    per_seq = blocks_for(ctx + 1)
    num_blocks = max(max(batches) * per_seq, blocks_for(n + 2))
    runner = ModelRunner(loaded, num_blocks, BLOCK_SIZE,
                         GraphPlan.make(max(batches), max(n + 2, ctx + 1), BLOCK_SIZE))
    sync = sync_for(plan.device)
    one = [ForwardItem([7], n, list(range(blocks_for(n + 2))), True)]     # context n + 1
    many = {b: [ForwardItem([7], ctx, list(range(i * per_seq, (i + 1) * per_seq)), True)
                for i in range(b)] for b in batches}
    with graphs_off(runner):          # the warm-up: every shape eagerly once
        for items in (one, *many.values()):
            runner.execute(items)
    sync()
    report = runner.capture_decode_graphs()
    on_cuda = plan.device.type == "cuda"
    rows = [row("graphs", "capture", report.describe(), "captured on a GPU",
                ("ok" if report.mode == "captured" else "FAIL") if on_cuda else "n/a")]

    def timed(items: list[ForwardItem], graphs: bool) -> float:
        if graphs:
            return timed_ms(lambda: runner.execute(items), plan.decode_repeats, sync) / 1e3
        with graphs_off(runner):
            return timed_ms(lambda: runner.execute(items), plan.decode_repeats, sync) / 1e3

    nbytes = decode_bytes(loaded, n + 1)
    for graphs in (True, False):
        step_s = timed(one, graphs)
        cells, mbu = bandwidth_cells(nbytes, step_s, plan.device)
        verdict = "n/a" if mbu is None else ("met" if mbu >= MBU_TARGET else "missed")
        rows.append(row("graphs", f"decode MBU, batch 1 @ {n + 1} ctx, graphs {'on' if graphs else 'off'}",
                        f"{cells}, {step_s * 1e3:.2f} ms/token", f">= {MBU_TARGET * 100:.0f} %"
                        if mbu is not None else f">= {MBU_TARGET * 100:.0f} % of a known card",
                        verdict))
    on_logits = runner.execute(one)
    device_ms = runner.last_decode_device_ms()
    wall_s = timed(one, True)
    rows.append(row("graphs", "device time of one replay (CUDA events)",
                    f"{device_ms:.2f} of {wall_s * 1e3:.2f} ms a step" if device_ms is not None
                    else f"no CUDA events on the {plan.device.type} (static decode ran eagerly)"))
    with graphs_off(runner):
        off_logits = runner.execute(one)
    if not bool(torch.isfinite(on_logits).all()):
        raise FloatingPointError("the graph's logits are not finite")
    rows.append(row("graphs", "logits, graphs on vs off, batch 1",
                    f"max |diff| {float((on_logits - off_logits).abs().max()):.4f} (largest "
                    f"|logit| {float(off_logits.abs().max()):.2f})"))
    for b, items in many.items():
        on_s, off_s = timed(items, True), timed(items, False)
        cells, _ = bandwidth_cells(decode_bytes(loaded, ctx + 1) + (b - 1) * (
            decode_bytes(loaded, ctx + 1) - decode_bytes(loaded, 0)), on_s, plan.device)
        rows.append(row("graphs", f"decode tokens/s, batch {b} @ {ctx + 1} ctx",
                        f"graphs on {b / on_s:,.0f} tok/s ({on_s * 1e3:.2f} ms/step, {cells}); "
                        f"off {b / off_s:,.0f} tok/s ({off_s * 1e3:.2f} ms/step)"))
    del runner, loaded
    if on_cuda:
        torch.cuda.empty_cache()
    return rows
