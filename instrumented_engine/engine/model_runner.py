"""The model runner: the only place batch tensors are built.

One `execute` = one forward pass over every scheduled sequence's new tokens, flattened into
a single varlen batch. Decodes go first so they share one padded attention call; each
multi-token (prefill) chunk gets its own. With a `GraphPlan`, a decode-only step that fits a
bucket runs the fixed-shape forward of `decode_graphs.py` instead (a CUDA graph's replay
once captured; eagerly on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from instrumented_engine.engine.decode_graphs import CaptureReport, DecodeGraphs, GraphPlan
from instrumented_engine.model.attention import (
    AttentionMetadata,
    DecodeBatch,
    PrefillBatch,
)
from instrumented_engine.model.loader import LoadedModel


@dataclass(slots=True, frozen=True)
class ForwardItem:
    """The work for one sequence in one step.

    >>> ForwardItem(token_ids=[5], start_pos=12, block_table=[3], want_logits=True).start_pos
    12
    """

    token_ids: list[int]     # the new tokens to compute this step (a prompt chunk, or 1 token when decoding)
    start_pos: int           # absolute position of token_ids[0] (== the sequence's num_computed_tokens)
    block_table: list[int]   # KV block ids covering positions [0, start_pos + len(token_ids))
    want_logits: bool        # return logits for the last of token_ids


@dataclass(slots=True, frozen=True)
class _Batch:
    input_ids: torch.Tensor      # [T]
    positions: torch.Tensor      # [T]
    meta: AttentionMetadata
    logits_rows: torch.Tensor    # [N] flat index of the last token of each want_logits item, item order


class ModelRunner:
    """Owns the paged KV cache and turns ForwardItems into one forward pass.

    It reads only `config`, `model`, `device` and `dtype` of the LoadedModel, so a tiny random
    model shows it: a decode step that reads the prompt's K/V from the cache gives the logits
    of computing all four tokens at once.

    >>> import types
    >>> from instrumented_engine.model.llama import LlamaForCausalLM, ModelConfig
    >>> config = ModelConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2,
    ...                      num_heads=4, num_kv_heads=2)
    >>> model = LlamaForCausalLM(config).eval(); model.init_rope(torch.device("cpu"))
    >>> tiny = types.SimpleNamespace(config=config, model=model, device=torch.device("cpu"),
    ...                              dtype=torch.float32)
    >>> runner = ModelRunner(tiny, num_kv_blocks=4, block_size=4)
    >>> runner.execute([ForwardItem([1, 2, 3], 0, [0], True)]).shape      # prefill: [1, vocab]
    torch.Size([1, 100])
    >>> step = runner.execute([ForwardItem([7], 3, [0], True)])           # decode the next token
    >>> whole = ModelRunner(tiny, 4, 4).execute([ForwardItem([1, 2, 3, 7], 0, [0], True)])
    >>> torch.allclose(step, whole, atol=1e-5)
    True

    With a graph plan the decode takes the fixed-shape path (eager here, on the CPU), in its
    bucket of 1 sequence x 16 keys, and gives the same logits:

    >>> static = ModelRunner(tiny, 4, 4, GraphPlan.make(2, 16, 4))
    >>> _ = static.execute([ForwardItem([1, 2, 3], 0, [0], True)])
    >>> torch.allclose(static.execute([ForwardItem([7], 3, [0], True)]), step, atol=1e-5)
    True
    >>> static.decode_graphs.report.mode, static.kv_cache.shape[2]   # one scratch block more
    ('eager', 5)
    """

    def __init__(self, loaded: LoadedModel, num_kv_blocks: int, block_size: int = 16,
                 graph_plan: GraphPlan | None = None) -> None:
        """`graph_plan`: the decode buckets (`decode_graphs.py`); None: every step generic."""
        if num_kv_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_kv_blocks and block_size must be positive, got {num_kv_blocks}, {block_size}")
        cfg = loaded.config
        self.model = loaded.model
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.vocab_size = cfg.vocab_size
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_position = cfg.max_position_embeddings
        # [layers, k/v, blocks, bs, kvh, hd], allocated once; each layer sees two views. The
        # decode buckets' padding rows write one scratch block past the block manager's.
        scratch = 1 if graph_plan is not None else 0
        self.kv_cache = torch.zeros(cfg.num_layers, 2, num_kv_blocks + scratch, block_size,
                                    cfg.num_kv_heads, cfg.head_dim, device=loaded.device,
                                    dtype=loaded.dtype)
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_cache]
        self.decode_graphs = None if graph_plan is None else DecodeGraphs(
            self.model, self.kv_caches, graph_plan, num_kv_blocks, cfg.vocab_size, self.device,
            self.dtype)

    def capture_decode_graphs(self) -> CaptureReport | None:
        """Capture the decode buckets (CUDA; after a warm-up); None without a graph plan."""
        return None if self.decode_graphs is None else self.decode_graphs.capture()

    def last_decode_device_ms(self) -> float | None:
        """The last step's device time from CUDA events around its graph's replay; None when
        it was not a replay."""
        return None if self.decode_graphs is None else self.decode_graphs.last_device_ms()

    def execute(self, items: list[ForwardItem]) -> torch.Tensor:
        """Run one step; float32 logits [num items with want_logits, vocab], in item order."""
        if not items:
            return torch.empty(0, self.vocab_size, device=self.device)
        for item in items:
            self._check(item)
        if self.decode_graphs is not None and all(len(it.token_ids) == 1 for it in items):
            with torch.inference_mode():
                logits = self.decode_graphs.run([it.token_ids[0] for it in items],
                                                [it.start_pos for it in items],
                                                [it.block_table for it in items],
                                                [it.want_logits for it in items])
            if logits is not None:
                return logits
        batch = self._prepare(items)
        with torch.inference_mode():
            hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_caches)
            return self.model.compute_logits(hidden[batch.logits_rows]).float()

    def _check(self, item: ForwardItem) -> None:
        end_pos = item.start_pos + len(item.token_ids)
        if not item.token_ids or item.start_pos < 0:
            raise ValueError(f"a ForwardItem needs tokens and start_pos >= 0: {item!r:.200}")
        if end_pos > self.max_position:
            raise ValueError(f"position {end_pos - 1} is beyond the model's {self.max_position} positions")
        num_needed = -(-end_pos // self.block_size)
        if len(item.block_table) < num_needed:
            raise ValueError(f"{num_needed} KV blocks needed for {end_pos} tokens, block table has {len(item.block_table)}")
        # An out-of-range block id would be a silent write elsewhere (or a device assert on CUDA).
        used = item.block_table[:num_needed]
        if min(used) < 0 or max(used) >= self.num_kv_blocks:
            raise ValueError(f"block id out of range [0, {self.num_kv_blocks}): {used}")

    def _prepare(self, items: list[ForwardItem]) -> _Batch:
        """The varlen batch of items already `_check`ed."""
        decode_idx = [i for i, it in enumerate(items) if len(it.token_ids) == 1]
        prefill_idx = [i for i, it in enumerate(items) if len(it.token_ids) > 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_row = [0] * len(items)
        bs = self.block_size
        for i in decode_idx + prefill_idx:
            it = items[i]
            end_pos = it.start_pos + len(it.token_ids)
            input_ids += it.token_ids
            positions += range(it.start_pos, end_pos)
            table = it.block_table
            slots += [table[p // bs] * bs + p % bs for p in range(it.start_pos, end_pos)]
            last_row[i] = len(input_ids) - 1
        decodes = [items[i] for i in decode_idx]
        prefills = [items[i] for i in prefill_idx]
        meta = AttentionMetadata(self._tensor(slots), len(decode_idx),
                                 self._decode_batch(decodes) if decodes else None,
                                 self._prefill_batch(prefills) if prefills else None)
        rows = [last_row[i] for i, it in enumerate(items) if it.want_logits]
        return _Batch(self._tensor(input_ids), self._tensor(positions), meta, self._tensor(rows))

    def _padded_tables(self, items: list[ForwardItem], context_lens: list[int]) -> tuple[torch.Tensor, int]:
        """Block tables [B, max_blocks], padded with block 0 (masked out), and max_blocks."""
        max_blocks = -(-max(context_lens) // self.block_size)
        tables = [it.block_table[:max_blocks] + [0] * (max_blocks - len(it.block_table[:max_blocks]))
                  for it in items]
        return self._tensor(tables), max_blocks

    def _decode_batch(self, decodes: list[ForwardItem]) -> DecodeBatch:
        """Tables and key bias [D, 1, 1, max_blocks · bs]: a sequence sees its own positions."""
        context_lens = [it.start_pos + 1 for it in decodes]
        tables, max_blocks = self._padded_tables(decodes, context_lens)
        keys = torch.arange(max_blocks * self.block_size, device=self.device)
        lens = self._tensor(context_lens)
        hidden = keys[None, :] >= lens[:, None]
        bias = torch.zeros(hidden.shape, dtype=self.dtype, device=self.device).masked_fill_(
            hidden, float("-inf"))
        return DecodeBatch(tables, bias[:, None, None, :], lens, max(context_lens))

    def _prefill_batch(self, chunks: list[ForwardItem]) -> PrefillBatch:
        lens = [len(it.token_ids) for it in chunks]
        num_tokens = sum(lens)
        if len(chunks) == 1 and chunks[0].start_pos == 0:   # its own k/v, causally: no gather
            return PrefillBatch(num_tokens, None, None, None, lens[0])
        longest = max(lens)
        context_lens = [it.start_pos + n for it, n in zip(chunks, lens)]
        tables, max_blocks = self._padded_tables(chunks, context_lens)
        # Query i of a chunk sits at absolute position start_pos + i and sees keys 0..that
        # position; padded query rows (i >= n) see key 0 only, so no softmax row is empty.
        query = torch.arange(longest, device=self.device)[None, :]               # [1, n]
        starts, ns = self._tensor([it.start_pos for it in chunks])[:, None], self._tensor(lens)[:, None]
        last_key = torch.where(query < ns, starts + query, 0)                      # [P, n]
        keys = torch.arange(max_blocks * self.block_size, device=self.device)
        mask = keys[None, None, :] <= last_key[:, :, None]                         # [P, n, L]
        pad_index = self._tensor([c * longest + i for c, n in enumerate(lens) for i in range(n)])
        return PrefillBatch(num_tokens, tables, mask[:, None], pad_index, longest)

    def _tensor(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
