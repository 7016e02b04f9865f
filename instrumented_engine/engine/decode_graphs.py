"""The decode step in fixed shapes, captured as CUDA graphs on a GPU (docs/architecture.md,
"The decode step on a GPU").

A batch-1 decode step of an 8B model launches ~690 kernels; eagerly, the host's launches set
the pace (docs/figures.md, "On an H200 (`bench/gpu_check.py`)"). A CUDA graph replays them
all with one launch, but only for fixed shapes reading fixed buffers. So a decode-only step
is padded into a bucket:

- a batch-size bucket B (1, 2, 4, ... up to max_num_seqs): rows past the step's sequences
  are padding, with token 0 at position 0, context length 1, and a slot in a scratch KV
  block that the model runner allocates past the block manager's (no live sequence owns it,
  so a padding row never writes a live sequence's K/V);
- a key-length bucket K blocks (powers of two and 1.5x them, from 256 tokens up to the
  longest captured context): attention gathers K·block_size keys for every row, and the
  mask (key position < context length) is built inside the graph from `context_lens`, so no
  shape depends on the step's data. The gather's bytes grow with K (pure-PyTorch attention
  reads the cache by gathering it), hence buckets on K as well as B: the longest context in
  the step costs at most 1.5x its own length.

Inputs live in one flat int64 buffer per bucket (token ids, positions, slots, context
lengths, then the B x K block table), filled with one host-to-device copy per step; the
logits go to one shared [max B, vocab] fp32 buffer. Steps with a prefill chunk, more
sequences than the largest bucket, or a context past the longest captured one run the
generic forward (`ModelRunner._prepare`).

On the CPU the same static forward runs eagerly (no capture): tests compare its logits with
the generic forward's. The engine uses it on CUDA only; the CPU keeps `decode_fast.py`.

After vLLM's CUDA-graph capture (vllm/worker/model_runner.py, `capture_model`, and v1's
`CUDAGraphWrapper` in vllm/compilation/cuda_graph.py) and nano-vllm's `capture_cudagraph`
(GeeeekExplorer/nano-vllm, nanovllm/engine/model_runner.py at 359f8ca): static input
tensors, one graph per batch size, the largest captured first into one shared memory pool.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch import nn

from instrumented_engine.model.attention import AttentionMetadata, DecodeBatch

# The longest context a graph covers (vLLM's former `max_seq_len_to_capture` default): a
# longer one decodes eagerly. The largest bucket's gather sets the graphs' memory.
MAX_CAPTURED_CONTEXT = 8192
MIN_KEY_TOKENS = 256          # the smallest key-length bucket, in tokens


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Powers of two up to max_num_seqs, and max_num_seqs itself.

    >>> batch_buckets(64), batch_buckets(12)
    ((1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 12))
    """
    sizes = [b for b in (1 << i for i in range(max_num_seqs.bit_length())) if b < max_num_seqs]
    return (*sizes, max_num_seqs)


def key_buckets(max_blocks: int, min_blocks: int) -> tuple[int, ...]:
    """Key lengths in blocks: 2^k and 3·2^(k-1) from min_blocks, then max_blocks itself.

    >>> key_buckets(512, 16)
    (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    >>> key_buckets(20, 16), key_buckets(4, 16)
    ((16, 20), (4,))
    """
    start = min(min_blocks, max_blocks)
    grid = sorted({s for k in range(max_blocks.bit_length() + 1) for s in (1 << k, 3 << k >> 1)})
    return (start, *(b for b in grid if start < b < max_blocks), *((max_blocks,) if start < max_blocks else ()))


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """Which buckets exist: batch sizes x key lengths (in blocks)."""

    batch_sizes: tuple[int, ...]
    key_blocks: tuple[int, ...]
    block_size: int

    @classmethod
    def make(cls, max_num_seqs: int, max_context: int, block_size: int) -> GraphPlan:
        """The buckets for up to max_num_seqs sequences of up to max_context tokens (capped at
        MAX_CAPTURED_CONTEXT).

        >>> GraphPlan.make(4, 1000, 16).key_blocks
        (16, 24, 32, 48, 63)
        """
        max_blocks = -(-min(max_context, MAX_CAPTURED_CONTEXT) // block_size)
        return cls(batch_buckets(max_num_seqs), key_buckets(max_blocks, -(-MIN_KEY_TOKENS // block_size)),
                   block_size)

    def pick(self, num_seqs: int, longest_context: int) -> tuple[int, int] | None:
        """The smallest (batch, key blocks) bucket holding the step; None: run it eagerly.

        >>> plan = GraphPlan((1, 2, 4), (16, 24), 16)
        >>> plan.pick(3, 300), plan.pick(1, 5), plan.pick(5, 10), plan.pick(1, 385)
        ((4, 24), (1, 16), None, None)
        """
        blocks = -(-longest_context // self.block_size)
        batch = next((b for b in self.batch_sizes if b >= num_seqs), None)
        keys = next((k for k in self.key_blocks if k >= blocks), None)
        return None if batch is None or keys is None else (batch, keys)

    def __len__(self) -> int:
        return len(self.batch_sizes) * len(self.key_blocks)

    def describe(self) -> str:
        """For the start-up line.

        >>> GraphPlan((1, 2, 4), (16, 24), 16).describe()
        '6 buckets: batch 1-4 x keys 256-384'
        """
        return (f"{len(self)} bucket{'s' * (len(self) > 1)}: batch {self.batch_sizes[0]}-"
                f"{self.batch_sizes[-1]} x keys "
                f"{self.key_blocks[0] * self.block_size}-{self.key_blocks[-1] * self.block_size}")


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """What the capture did, for the start-up line and gpu_check.

    >>> CaptureReport("off", "cpu: the static decode runs eagerly").describe()
    'cuda graphs: off (cpu: the static decode runs eagerly)'
    >>> CaptureReport("captured", "6 buckets", 6, 0.25, 3 << 20).describe()
    'cuda graphs: 6 captured (6 buckets) in 0.25 s, 3.0 MiB'
    """

    mode: str            # "captured" | "eager" (CPU: static forward, no graph) | "off" | "pending"
    detail: str
    graphs: int = 0
    seconds: float = 0.0
    nbytes: int = 0      # the graphs' pool (reserved memory grown during capture) + static buffers

    def describe(self) -> str:
        if self.mode != "captured":
            return f"cuda graphs: {self.mode} ({self.detail})"
        return (f"cuda graphs: {self.graphs} captured ({self.detail}) in {self.seconds:.2f} s, "
                f"{self.nbytes / 2**20:.1f} MiB")


def plan_for(device: torch.device, enforce_eager: bool, max_num_seqs: int, max_context: int,
             block_size: int) -> tuple[GraphPlan | None, CaptureReport]:
    """The engine's buckets, or None and why there are none: graphs are for CUDA only (the
    CPU keeps its own decode path, `decode_fast.py`), and `--enforce-eager` turns them off.

    >>> plan_for(torch.device("cpu"), False, 64, 8192, 16)[1].describe()
    'cuda graphs: off (cpu: decode runs its CPU path)'
    >>> plan_for(torch.device("cuda"), True, 64, 8192, 16)[1].describe()
    'cuda graphs: off (--enforce-eager)'
    >>> plan, report = plan_for(torch.device("cuda"), False, 64, 8192, 16)
    >>> report.mode, len(plan)
    ('pending', 77)
    """
    if device.type != "cuda":
        return None, CaptureReport("off", f"{device.type}: decode runs its CPU path")
    if enforce_eager:
        return None, CaptureReport("off", "--enforce-eager")
    plan = GraphPlan.make(max_num_seqs, max_context, block_size)
    return plan, CaptureReport("pending", f"{plan.describe()}, captured after the warm-up")


class StaticDecode:
    """One bucket: its fixed input buffers and the forward that reads only them."""

    def __init__(self, model: nn.Module, kv_caches: list, batch: int, key_blocks: int,
                 block_size: int, scratch_block: int, logits: torch.Tensor, dtype: torch.dtype) -> None:
        device = logits.device
        self.model, self.kv_caches, self.dtype = model, kv_caches, dtype
        self.batch, self.key_blocks, self.block_size = batch, key_blocks, block_size
        self.scratch_block = scratch_block
        b = batch
        self.inputs = torch.zeros(4 * b + b * key_blocks, dtype=torch.long, device=device)
        self.input_ids, self.positions = self.inputs[:b], self.inputs[b:2 * b]
        self.slot_mapping, self.context_lens = self.inputs[2 * b:3 * b], self.inputs[3 * b:4 * b]
        self.block_tables = self.inputs[4 * b:].view(b, key_blocks)
        self.keys = torch.arange(key_blocks * block_size, device=device)
        self.logits = logits[:b]
        self.fill([], [], [])                       # every row padding: safe to run as it is

    def fill(self, token_ids: list[int], positions: list[int], tables: list[list[int]]) -> None:
        """Copy one step's decodes into the buffers (one host-to-device copy), padding the rest."""
        b, k, bs, scratch = self.batch, self.key_blocks, self.block_size, self.scratch_block
        pad = b - len(token_ids)
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions)]
        flat = [*token_ids, *[0] * pad, *positions, *[0] * pad, *slots, *[scratch * bs] * pad,
                *(p + 1 for p in positions), *[1] * pad]
        for table in tables:    # a table's tail past its context is masked: any valid block
            flat += table[:k] + [scratch] * (k - len(table[:k]))
        flat += [scratch] * (k * pad)
        self.inputs.copy_(torch.tensor(flat, dtype=torch.long))

    def forward(self) -> None:
        """The step from the buffers into `logits`: what a graph captures."""
        hidden_keys = self.keys[None, :] >= self.context_lens[:, None]          # [B, L]
        bias = torch.zeros(hidden_keys.shape, dtype=self.dtype, device=self.keys.device)
        bias.masked_fill_(hidden_keys, float("-inf"))
        decode = DecodeBatch(self.block_tables, bias[:, None, None, :], self.context_lens,
                             self.key_blocks * self.block_size)
        meta = AttentionMetadata(self.slot_mapping, self.batch, decode, None)
        hidden = self.model(self.input_ids, self.positions, meta, self.kv_caches)
        self.logits.copy_(self.model.compute_logits(hidden))


class DecodeGraphs:
    """The buckets of one model runner, captured on CUDA, eager on the CPU.

    `run` returns None for a step it does not serve (the runner then runs it generically);
    on CUDA it serves nothing until `capture` succeeded, so the engine's warm-up runs eager.
    """

    def __init__(self, model: nn.Module, kv_caches: list, plan: GraphPlan, scratch_block: int,
                 vocab_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.plan, self.device = plan, device
        self.logits = torch.zeros(plan.batch_sizes[-1], vocab_size, dtype=torch.float32, device=device)
        self.steps = {(b, k): StaticDecode(model, kv_caches, b, k, plan.block_size, scratch_block,
                                           self.logits, dtype)
                      for b in plan.batch_sizes for k in plan.key_blocks}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        if device.type == "cuda":
            self.report = CaptureReport("pending", f"{plan.describe()}, captured after the warm-up")
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        else:
            self.report = CaptureReport("eager", f"{device.type}: no CUDA graphs, the static "
                                        f"decode runs eagerly; {plan.describe()}")
            self._events = None
        self._timed = False

    @property
    def buffer_bytes(self) -> int:
        return self.logits.nbytes + sum(s.inputs.nbytes + s.keys.nbytes for s in self.steps.values())

    def run(self, token_ids: list[int], positions: list[int], tables: list[list[int]],
            want_logits: list[bool]) -> torch.Tensor | None:
        """fp32 logits of the rows that want them, or None: not a step for a bucket."""
        mode = self.report.mode
        bucket = self.plan.pick(len(token_ids), max(positions) + 1) if mode in ("captured", "eager") else None
        if bucket is None or (mode == "captured" and bucket not in self.graphs):
            return None
        step = self.steps[bucket]
        step.fill(token_ids, positions, tables)
        if mode == "eager":
            step.forward()
            self._timed = False
        else:
            start, end = self._events
            start.record()
            self.graphs[bucket].replay()
            end.record()
            self._timed = True
        n = len(token_ids)
        if all(want_logits):
            return step.logits[:n].clone()     # the next step overwrites the buffer
        rows = [i for i, want in enumerate(want_logits) if want]
        return step.logits[torch.tensor(rows, device=self.device)]

    def last_device_ms(self) -> float | None:
        """The device time of the last replayed graph, from CUDA events recorded around its
        launch (waits for it); None when the last step was not a replay."""
        if not self._timed:
            return None
        start, end = self._events
        end.synchronize()
        return start.elapsed_time(end)

    def capture(self) -> CaptureReport:
        """Capture every bucket (CUDA); on the CPU report the eager mode and capture nothing.
        A capture that fails with the default attention kernels is retried with the
        memory-efficient and math ones only; if that fails too, decode runs eagerly."""
        if self.device.type != "cuda":
            return self.report
        from torch.nn.attention import SDPBackend, sdpa_kernel

        errors = []
        for name, kernels in (("default attention", None),
                              ("efficient/math attention",
                               [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])):
            try:
                self.report = self._capture_all(name, kernels, sdpa_kernel)
                return self.report
            except Exception as exc:  # noqa: BLE001 - an uncapturable kernel: try the next, or eager
                self.graphs.clear()
                errors.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
        self.report = CaptureReport("off", "capture failed, decode runs eagerly; " + "; ".join(errors))
        return self.report

    def _capture_all(self, name: str, kernels, sdpa_kernel) -> CaptureReport:
        torch.cuda.synchronize(self.device)
        reserved_before = torch.cuda.memory_reserved(self.device)
        start_s = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(self.device)
        # Largest first: the smaller graphs' memory then fits in the pool it left.
        for bucket in sorted(self.steps, reverse=True):
            step = self.steps[bucket]
            step.fill([], [], [])
            choice = sdpa_kernel(kernels) if kernels else contextlib.nullcontext()
            with torch.inference_mode(), choice:
                side = torch.cuda.Stream(self.device)   # warm-up off the capture stream (torch docs)
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    step.forward()
                current.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: another thread's CUDA call (a metrics read) cannot break it.
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    step.forward()
            self.graphs[bucket] = graph
        torch.cuda.synchronize(self.device)
        grown = torch.cuda.memory_reserved(self.device) - reserved_before
        return CaptureReport("captured", f"{self.plan.describe()}, {name}", len(self.graphs),
                             time.perf_counter() - start_s, grown + self.buffer_bytes)
