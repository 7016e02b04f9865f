"""Print the model runner's raw speed: single-stream decode, batch-16 decode, 1,024-token prefill.

    python bench/model_speed.py [--device cpu|cuda] [--threads 2] [--model PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from instrumented_engine.model.loader import load_model
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner

BLOCK_SIZE = 16


def timed_ms(fn, repeats: int, sync) -> float:
    """Median wall time of fn() in ms, after one warm-up call."""
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weight-format", default="auto")
    parser.add_argument("--context", type=int, default=256, help="tokens already cached when decoding")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, args.device, args.dtype, args.weight_format)
    sync = torch.cuda.synchronize if loaded.device.type == "cuda" else (lambda: None)
    blocks_per_seq = (max(args.context, 1024) + 64) // BLOCK_SIZE + 1
    runner = ModelRunner(loaded, num_kv_blocks=16 * blocks_per_seq, block_size=BLOCK_SIZE)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(16)]
    prompt = [int(t) for t in torch.randint(100, loaded.config.vocab_size, (1024,))]

    prefill_ms = timed_ms(lambda: runner.execute([ForwardItem(prompt, 0, tables[0], True)]), 3, sync)
    for table in tables:   # every sequence has `context` tokens cached before decoding
        runner.execute([ForwardItem(prompt[:args.context], 0, table, False)])
    single = [ForwardItem([7], args.context, tables[0], True)]
    batch = [ForwardItem([7], args.context, table, True) for table in tables]
    single_ms = timed_ms(lambda: runner.execute(single), 20, sync)
    batch_ms = timed_ms(lambda: runner.execute(batch), 10, sync)

    print(f"model {loaded.name} on {loaded.device} {loaded.dtype} "
          f"(kernels: {'+'.join(loaded.weight_formats)}), {torch.get_num_threads()} threads")
    print(f"prefill 1024 tokens: {prefill_ms:.0f} ms = {1024 / prefill_ms * 1e3:.0f} tokens/s")
    print(f"decode, 1 sequence @ {args.context} ctx: {single_ms:.1f} ms/token")
    print(f"decode, 16 sequences @ {args.context} ctx: {batch_ms:.1f} ms/step = "
          f"{16 / batch_ms * 1e3:.0f} tokens/s")


if __name__ == "__main__":
    main()
