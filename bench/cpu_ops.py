"""The fused C kernels (instrumented_engine/model/cpu_fused.c) against the torch ops they replace,
one op at a time and in a whole decode step, interleaved A/B. Prints medians and ratios.

    .venv/bin/python bench/cpu_ops.py              # ~1 min on 2 cores
    .venv/bin/python bench/cpu_ops.py --rounds 50

- ops: SmolLM2's shapes (hidden 576, 9 query / 3 kv heads of 64), bf16, keys per sequence
  272, at 1 / 4 / 16 decoding sequences. "torch" is what the model runs without the fused
  ops: F.rms_norm after the residual add; apply_rope + two index_copy_; the key/value gather
  plus SDPA (up to 4 sequences) or two matmuls.
- matmuls: the hand-written decode matmuls against torch's kernels they stand beside, on
  random weights of SmolLM2's shapes: the int8 head (`q8_matmul.c` vs `_weight_int8pack_mm`)
  and one decoder layer's four linears in q4_1 (`q4_matmul.c`) vs torch's int4 kernel.
- step: `ModelRunner.execute` of one decode step of the packaged model (int4 + int8 head,
  as loaded by default), with the fused norm, rope and attention ops (and, with them, the
  decode step's flat loop, decode_fast.py) and with them switched off (the head's int8 kernel
  runs in both).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner  # noqa: E402
from instrumented_engine.model import cpu_fused  # noqa: E402
from instrumented_engine.model.attention import _decode_attention_cpu, _gather  # noqa: E402
from instrumented_engine.model.decode_fast import DecodeFastPath  # noqa: E402
from instrumented_engine.model.llama import Attention, RMSNorm, apply_rope  # noqa: E402
from instrumented_engine.model.loader import load_model  # noqa: E402
from instrumented_engine.model.quant import Int4Weight, Int8Weight, Q4Weight  # noqa: E402

BF16 = torch.bfloat16
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, KEYS, BLOCK = 576, 9, 3, 64, 272, 16


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def op_pairs(ops: cpu_fused.FusedCpuOps, seqs: int) -> dict[str, tuple]:
    """name -> (torch version, fused version), both closures over the same inputs."""
    x, delta = torch.randn(seqs, HIDDEN).to(BF16), torch.randn(seqs, HIDDEN).to(BF16)
    weight = torch.rand(HIDDEN).to(BF16)
    blocks = seqs * (KEYS // BLOCK) + 1
    k_cache, v_cache = (torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM).to(BF16) for _ in "kv")
    tables = (torch.arange(seqs * (KEYS // BLOCK)) + 1).view(seqs, -1)
    lens = torch.full((seqs,), KEYS)
    bias = torch.zeros(seqs, 1, 1, KEYS, dtype=BF16)
    qkv = torch.randn(seqs, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(BF16)
    cos, sin = torch.rand(seqs, 1, HEAD_DIM).to(BF16), torch.rand(seqs, 1, HEAD_DIM).to(BF16)
    slots = torch.arange(seqs) * BLOCK + 1
    q = qkv[:, :HEADS * HEAD_DIM].view(seqs, HEADS, HEAD_DIM)
    qk_size = (HEADS + KV_HEADS) * HEAD_DIM

    def torch_rope():
        qk = apply_rope(qkv[:, :qk_size].view(seqs, -1, HEAD_DIM), cos, sin)
        k_cache.view(-1, KV_HEADS, HEAD_DIM).index_copy_(0, slots, qk[:, HEADS:])
        v_cache.view(-1, KV_HEADS, HEAD_DIM).index_copy_(
            0, slots, qkv[:, qk_size:].view(seqs, KV_HEADS, HEAD_DIM))

    return {
        "add + rms_norm": (lambda: F.rms_norm(x + delta, (HIDDEN,), weight, 1e-5),
                           lambda: ops.add_rms_norm(x.clone(), delta, weight, 1e-5)),
        "rope + kv writes": (torch_rope,
                             lambda: ops.rope_store_kv(qkv.clone(), HEADS, KV_HEADS, cos, sin, slots,
                                                       k_cache, v_cache)),
        "decode attention": (lambda: _decode_attention_cpu(q, _gather(k_cache, tables),
                                                           _gather(v_cache, tables), bias),
                             lambda: ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, KEYS)),
    }


def bench_ops(ops: cpu_fused.FusedCpuOps, rounds: int) -> None:
    print(f"ops  (µs per call, median of {rounds} interleaved rounds of 200 calls; bf16, {KEYS} keys)")
    print(f"  {'op':18s} {'seqs':>4s} {'torch':>9s} {'fused':>9s} {'ratio':>7s}")
    for seqs in (1, 4, 16):
        for name, (reference, fused) in op_pairs(ops, seqs).items():
            times = {"torch": [], "fused": []}
            for _ in range(rounds):
                times["torch"].append(per_call_us(reference, 200))
                times["fused"].append(per_call_us(fused, 200))
            a, b = statistics.median(times["torch"]), statistics.median(times["fused"])
            print(f"  {name:18s} {seqs:4d} {a:9.1f} {b:9.1f} {a / b:6.2f}x")


VOCAB, INTERMEDIATE = 49152, 1536
# One decoder layer's linears, [out, in]: qkv, o, gate_up, down.
LAYER_SHAPES = ((HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN), (HIDDEN, HIDDEN),
                (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE))


def bench_matmuls(ops: cpu_fused.FusedCpuOps, rounds: int) -> None:
    torch.manual_seed(0)
    head = Int8Weight.quantize(torch.randn(VOCAB, HIDDEN) * 0.05, ops)
    layer = [torch.randn(n, k) * 0.05 for n, k in LAYER_SHAPES]
    int4, q4 = [Int4Weight.quantize(w) for w in layer], [Q4Weight.quantize(w, ops) for w in layer]
    print(f"matmuls  (µs per call, median of {rounds} interleaved rounds of 20 calls; "
          f"random weights, {torch.get_num_threads()} threads)")
    cases = []
    for rows in (1, 4):
        x = torch.randn(rows, HIDDEN).to(BF16)
        cases.append((f"head [{VOCAB}, {HIDDEN}] int8", rows,
                      lambda x=x: torch.ops.aten._weight_int8pack_mm(x, head.codes, head.scale),
                      lambda x=x: head.matmul(x)))
    xs = [torch.randn(1, k).to(BF16) for _, k in LAYER_SHAPES]
    cases.append(("one layer's 4 linears, int4 vs q4_1", 1,
                  lambda: [w.matmul(x) for w, x in zip(int4, xs)],
                  lambda: [w.matmul(x) for w, x in zip(q4, xs)]))
    for name, rows, reference, ours in cases:
        times = {"torch": [], "C": []}
        for i in range(rounds):
            for arm, fn in (("torch", reference), ("C", ours))[:: 1 if i % 2 else -1]:
                fn()
                times[arm].append(per_call_us(fn, 20))
        a, b = statistics.median(times["torch"]), statistics.median(times["C"])
        print(f"  {name}, {rows} rows: torch {a:.1f}  C {b:.1f}  ({a / b:.2f}x)")


def switch_fused(model, fused) -> None:
    for module in model.layers.modules():
        if isinstance(module, RMSNorm):
            module.fused = fused
        elif isinstance(module, Attention):
            module.use_fused(fused)
    model.decode_fast = DecodeFastPath.build(model, fused)     # the flat loop needs them all


def bench_step(ops: cpu_fused.FusedCpuOps, rounds: int) -> None:
    loaded = load_model(None, "cpu")
    runner = ModelRunner(loaded, num_kv_blocks=16 * 20, block_size=BLOCK)
    tables = [list(range(i * 20, (i + 1) * 20)) for i in range(16)]
    for table in tables:
        runner.execute([ForwardItem(list(range(1000, 1000 + KEYS - 1)), 0, table, False)])
    print(f"decode step  (ms, median of {rounds} interleaved rounds of 5 steps; "
          f"{torch.backends.cpu.get_cpu_capability()} {'+'.join(loaded.weight_formats)}, "
          f"{torch.get_num_threads()} threads)")
    print(f"  {'seqs':>4s} {'torch ops':>10s} {'fused':>8s} {'ratio':>7s}")
    for seqs in (1, 4, 16):
        items = [ForwardItem([7], KEYS - 1, table, True) for table in tables[:seqs]]
        times = {"torch": [], "fused": []}
        for _ in range(rounds):
            for name, fused in (("torch", None), ("fused", ops)):
                switch_fused(loaded.model, fused)
                runner.execute(items)
                times[name].append(per_call_us(lambda: runner.execute(items), 5) / 1e3)
        a, b = statistics.median(times["torch"]), statistics.median(times["fused"])
        print(f"  {seqs:4d} {a:10.2f} {b:8.2f} {a / b:6.2f}x")
    switch_fused(loaded.model, ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    ops = cpu_fused.load()
    if ops is None:
        print("the fused CPU ops did not build on this machine (see the warning above)")
        return 1
    bench_ops(ops, args.rounds)
    bench_matmuls(ops, args.rounds)
    bench_step(ops, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
