"""What the engine's step record costs: per step, and in decode tok/s. One run.

    .venv/bin/python bench/step_record_cost.py [--rounds 5] [--quick]

- per step: `LLMEngine._record_step` on a real 16-sequence decode step's plan (the tuple,
  the ring append and the step metrics' two observations), timed over many calls;
- decode tok/s at 1 and 16 streams (128 prompt + 64 output tokens, greedy, ignore_eos), with
  the step record on and off, A/B interleaved on one engine, so drift hits both alike; each
  arm has prompts of its own (no prefix-cache hit from the other arm's).
  "off" replaces `_record_step` with a no-op: the whole feature, ring and metrics, is out.
Prints medians, their spread (min-max) and the on/off ratios; the CPU is named.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from engine_bench import text_of_tokens, throughput  # noqa: E402
from instrumented_engine.engine.config import EngineConfig  # noqa: E402
from instrumented_engine.engine.llm_engine import LLMEngine  # noqa: E402
from instrumented_engine.engine.sampling import SamplingParams  # noqa: E402
from instrumented_engine.model.loader import load_model  # noqa: E402
from instrumented_engine.server.recording import TimelineRecorder  # noqa: E402
from tracer.sinks.engine_steps import EngineStepMetrics  # noqa: E402


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def per_step_us(engine: LLMEngine, calls: int) -> float:
    """`_record_step` on a 16-sequence decode step, µs a call."""
    sampling = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i in range(16):
        engine.add_request(f"s{i}", text_of_tokens(engine, 32, salt=9000 + i), sampling)
    engine.step()                                   # the prefills and the first tokens
    plan = engine.schedule()                        # a decode step of all 16
    assert len(plan.scheduled) == 16
    start = time.perf_counter()
    for _ in range(calls):
        engine._record_step(plan, 0, 1)
    cost = (time.perf_counter() - start) / calls * 1e6
    engine.postprocess(plan, *engine.execute(plan))
    while engine.has_unfinished():
        engine.step()
    return cost


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f}  ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 and 4 streams")
    args = parser.parse_args()
    rounds, levels = (2, (1, 4)) if args.quick else (args.rounds, (1, 16))
    torch.set_num_threads(args.threads)
    loaded = load_model(None)
    engine = LLMEngine(EngineConfig(num_kv_blocks=4096), loaded=loaded)
    engine.recorder = TimelineRecorder(
        on_step=EngineStepMetrics(CollectorRegistry(), loaded.name).observe)
    record_step = engine._record_step
    print(f"CPU {cpu_name()}  torch capability {torch.backends.cpu.get_cpu_capability()}  "
          f"threads {torch.get_num_threads()}  model {loaded.name}")
    cost = per_step_us(engine, 2_000 if args.quick else 20_000)
    print(f"step record  {cost:.2f} us per 16-sequence step (tuple + ring + 2 observations)")
    tok_s = {(n, arm): [] for n in levels for arm in ("on", "off")}
    for r in range(rounds):
        for n in levels:
            for arm in (("on", "off") if r % 2 == 0 else ("off", "on")):
                engine._record_step = record_step if arm == "on" else (lambda *a: None)
                # Each arm its own prompts: with one salt for both, the second arm's prefills
                # were prefix-cache hits, and the ratio flipped with the order each round.
                salt = (r * 100 + n) * 2 + (arm == "off")
                tok_s[n, arm].append(throughput(engine, n, salt=salt))
    engine._record_step = record_step
    print(f"decode tok/s, 128 prompt + 64 output tokens, rounds={rounds}: median (min-max)")
    for n in levels:
        on, off = tok_s[n, "on"], tok_s[n, "off"]
        ratios = [a / b for a, b in zip(on, off)]
        print(f"  {n:2d} streams  on {spread(on)}  off {spread(off)}  "
              f"on/off {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    print(f"steps kept {len(engine.steps)} of {engine.steps.num_steps} "
          f"(--step-log-size {engine.steps.capacity})")


if __name__ == "__main__":
    main()
