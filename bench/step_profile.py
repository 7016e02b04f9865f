"""Where a model step's time goes, by op: torch.profiler over decode steps and a prefill of the
packaged model, as the engine runs them on this CPU (the plan `cpu_formats.py` picks, or a
forced one). Profile before optimising; docs/figures.md's per-capability figures quote this.

    .venv/bin/python bench/step_profile.py                 # ~1 min on 2 cores
    .venv/bin/python bench/step_profile.py --weight-format fp32 --top 15
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python bench/step_profile.py

The last form runs torch's AVX2 kernels and oneDNN's AVX2 code on a CPU that has more (the
fused C ops follow torch's level, `cpu_fused.py`): what an AVX2 machine runs, on this one.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner  # noqa: E402
from instrumented_engine.model.loader import load_model  # noqa: E402

BLOCK_SIZE = 16
CONTEXT = 256          # tokens cached before each decode step


def table(prof, steps: int, top: int, wall_s: float) -> str:
    """The `top` ops by self CPU time, per step, with their share of the step's wall time;
    what no torch op accounts for (the fused C ops, called through ctypes, and Python) last."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    wall_us = wall_s * 1e6
    ops_us = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    lines = [f"    {'op':44s} {'ms/step':>8s} {'share':>6s} {'calls/step':>10s}"]
    for e in events[:top]:
        lines.append(f"    {e.key[:44]:44s} {e.self_cpu_time_total / steps / 1e3:8.3f} "
                     f"{e.self_cpu_time_total / wall_us:6.1%} {e.count / steps:10.1f}")
    lines.append(f"    {'outside torch ops (fused C ops, Python)':44s} "
                 f"{max(wall_us - ops_us, 0) / steps / 1e3:8.3f} {max(wall_us - ops_us, 0) / wall_us:6.1%}")
    lines.append(f"    {'step (wall)':44s} {wall_us / steps / 1e3:8.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weight-format", default="auto")
    parser.add_argument("--steps", type=int, default=10, help="decode steps profiled per size")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(None, "cpu", args.dtype, args.weight_format)
    print(f"{loaded.name}: " + ", ".join(f"{k} {v}" for k, v in loaded.describe().items())
          + f"; {torch.get_num_threads()} threads")
    blocks = (CONTEXT + 64) // BLOCK_SIZE + 1
    runner = ModelRunner(loaded, num_kv_blocks=16 * blocks, block_size=BLOCK_SIZE)
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(16)]
    prompt = [int(t) for t in torch.randint(100, loaded.config.vocab_size, (CONTEXT,))]
    for tbl in tables:
        runner.execute([ForwardItem(prompt, 0, tbl, False)])
    cases = {f"decode, {n} sequence{'s' if n > 1 else ''}":
             ([ForwardItem([7], CONTEXT, tbl, True) for tbl in tables[:n]], args.steps)
             for n in (1, 16)}
    cases[f"prefill, {CONTEXT} tokens"] = ([ForwardItem(prompt, 0, tables[0], True)], 2)
    for name, (items, steps) in cases.items():
        runner.execute(items)                       # warm: oneDNN's primitives are cached
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                runner.execute(items)
            wall_s = time.perf_counter() - start
        print(f"\n{name} (self CPU time of the calling thread, {steps} steps)")
        print(table(prof, steps, args.top, wall_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
