"""Engine figures for docs/figures.md (issue: engine). Prints medians and ratios from one run.

    .venv/bin/python bench/engine_bench.py                 # all three sections
    .venv/bin/python bench/engine_bench.py --only prefix   # prefix | batching | single

- prefix:   TTFT of a ~1,500-token shared system prompt + ~20-token question, cold vs hit,
            interleaved A/B (each cold trial uses a fresh system prompt so it truly misses).
- batching: aggregate output tokens/s at 1, 4 and 16 concurrent requests
            (128 prompt tokens, 64 output tokens, greedy, ignore_eos).
- single:   prefill tokens/s at 1,024 prompt tokens; decode ms per token at batch 1.
TTFT here is engine-side: add_request → first printable text (the server adds receive/send).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from instrumented_engine.engine.config import EngineConfig  # noqa: E402
from instrumented_engine.engine.llm_engine import LLMEngine  # noqa: E402
from instrumented_engine.model.loader import load_model  # noqa: E402
from instrumented_engine.engine.sampling import SamplingParams  # noqa: E402

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def text_of_tokens(engine: LLMEngine, num_tokens: int, salt: int) -> list[int]:
    words = [WORDS[(i * 7 + salt * 13 + i // 5) % len(WORDS)] for i in range(num_tokens)]
    ids = engine.tokenizer.encode(f"[{salt}] " + " ".join(words))
    return ids[:num_tokens]


def ttft_s(engine: LLMEngine, ids: list[int]) -> float:
    start = time.perf_counter()
    engine.add_request("ttft", ids, SamplingParams(temperature=0.0, max_tokens=1,
                                                   ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def bench_prefix(engine: LLMEngine, trials: int) -> None:
    question = text_of_tokens(engine, 20, salt=999)
    shared = text_of_tokens(engine, 1500, salt=0) + question
    ttft_s(engine, shared)  # warm the cache with the shared prompt
    cold, hit = [], []
    for trial in range(trials):  # A/B interleaved
        cold.append(ttft_s(engine, text_of_tokens(engine, 1500, salt=trial + 1) + question))
        hit.append(ttft_s(engine, shared))
    c, h = statistics.median(cold), statistics.median(hit)
    print(f"prefix cache  prompt={len(shared)} tokens  trials={trials}")
    print(f"  TTFT cold  median {c * 1e3:8.1f} ms")
    print(f"  TTFT hit   median {h * 1e3:8.1f} ms")
    print(f"  speed-up   {c / h:6.1f}x  (target >= 5x)")


def throughput(engine: LLMEngine, concurrency: int, salt: int) -> float:
    sampling = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for i in range(concurrency):
        engine.add_request(f"b{i}", text_of_tokens(engine, 128, salt=salt * 100 + i), sampling)
    start, tokens = time.perf_counter(), 0
    while engine.has_unfinished():
        tokens += sum(out.num_new_tokens for out in engine.step())
    return tokens / (time.perf_counter() - start)


def bench_batching(engine: LLMEngine, rounds: int) -> None:
    levels = (1, 4, 16)
    results = {n: [] for n in levels}
    for r in range(rounds):  # interleave the levels so drift hits them all alike
        for n in levels:
            results[n].append(throughput(engine, n, salt=r * 10 + n))
    base = statistics.median(results[1])
    print(f"continuous batching  128 prompt + 64 output tokens, rounds={rounds}")
    for n in levels:
        med = statistics.median(results[n])
        print(f"  {n:2d} concurrent  {med:8.1f} output tok/s  ({med / base:4.1f}x one stream)")
    print("  target: 16 concurrent >= 4x one stream")


def bench_single(engine: LLMEngine, trials: int) -> None:
    prefill, decode = [], []
    for trial in range(trials):
        ids = text_of_tokens(engine, 1024, salt=5000 + trial)
        prefill.append(1024 / ttft_s(engine, ids))
        engine.add_request("d", text_of_tokens(engine, 16, salt=7000 + trial),
                           SamplingParams(temperature=0.0, max_tokens=65, ignore_eos=True))
        engine.step()  # prefill + first token
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        decode.append((time.perf_counter() - start) / 64 * 1e3)
    print(f"single stream  trials={trials}")
    print(f"  prefill 1,024 tokens  median {statistics.median(prefill):8.1f} tok/s")
    print(f"  decode batch 1        median {statistics.median(decode):8.2f} ms/token")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=("prefix", "batching", "single"))
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(None)
    engine = LLMEngine(EngineConfig(num_kv_blocks=4096, max_num_batched_tokens=2048),
                       loaded=loaded)
    print(f"model {loaded.name}  device {loaded.device}  dtype {loaded.dtype}  "
          f"threads {torch.get_num_threads()}  torch {torch.__version__}")
    if args.only in (None, "prefix"):
        bench_prefix(engine, args.trials)
    if args.only in (None, "batching"):
        bench_batching(engine, max(2, args.trials // 2))
    if args.only in (None, "single"):
        bench_single(engine, args.trials)


if __name__ == "__main__":
    main()
