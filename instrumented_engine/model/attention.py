"""Paged attention over the block KV cache: one call for the step's decodes, one for its
prefill chunks, whatever their number (no Python loop over sequences in any layer).

Decodes in bf16 on CPU read the paged cache in place through `cpu_fused.c`; elsewhere (CUDA,
fp32, shapes the C kernel has no instance for) their keys are gathered and go through SDPA or
two matmuls.

Shapes: T = new tokens in the step (decodes first, then the prefill chunks), nh / kvh = query /
key-value heads, hd = head dim, D = decoding sequences, P = prefill chunks, n = the longest
chunk, bs = block size, L = padded key length (max blocks · bs). The model runner builds this
metadata once per step; every layer reuses it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from instrumented_engine.model.cpu_fused import FusedCpuOps


@dataclass(slots=True, frozen=True)
class DecodeBatch:
    """D sequences with one new token each: tokens [0, D) of the step."""

    block_tables: torch.Tensor      # [D, max_blocks], padded with block 0
    bias: torch.Tensor              # [D, 1, 1, L] in the model's dtype: 0 = may attend, -inf not
    context_lens: torch.Tensor      # [D] int64: keys each sequence attends to, its new one included
    max_context_len: int


@dataclass(slots=True, frozen=True)
class PrefillBatch:
    """P multi-token chunks: tokens [D, T) of the step.

    One chunk with nothing cached before it attends to its own new k/v (`block_tables` None):
    the common first prompt, with no gather. Otherwise the queries are scattered into a padded
    [P, n] grid and the keys gathered from the cache, where this step already wrote them.
    """

    num_tokens: int
    block_tables: torch.Tensor | None   # [P, max_blocks]
    mask: torch.Tensor | None           # [P, 1, n, L] bool; padded query rows see key 0 only
    pad_index: torch.Tensor | None      # [num_tokens] each token's row in the flat [P · n] grid
    max_chunk_len: int                  # n


@dataclass(slots=True, frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor          # [T] flat cache slot (block · bs + offset) per token
    num_decode_tokens: int              # D
    decode: DecodeBatch | None
    prefill: PrefillBatch | None


def _gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """cache [blocks, bs, kvh, hd], tables [B, max_blocks] -> [B, kvh, L, hd]."""
    _, _, kvh, hd = cache.shape
    # index_select, not cache[tables]: advanced indexing of a cache view is ~500x slower on CPU.
    return cache.index_select(0, tables.view(-1)).view(tables.shape[0], -1, kvh, hd).transpose(1, 2)


# Up to this many decoding sequences, CPU decode attention is one SDPA call; more take two
# batched matmuls. Measured per layer at 272 keys, bf16, two threads (docs/reference.md,
# "Decode attention on CPU"): SDPA 26 / 37 / 67 / 128 µs at 1 / 2 / 4 / 8 sequences, the
# matmuls 58 / 66 / 81 / 114 µs.
SDPA_MAX_DECODES = 4


def _in(compute_dtype: torch.dtype | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in the dtype attention computes in (unchanged when it is None)."""
    if compute_dtype is None:
        return tensors
    return tuple(t if t.dtype == compute_dtype else t.to(compute_dtype) for t in tensors)


def _back(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in the model's dtype again; no `.to` call (a dispatch a layer) where it already is."""
    return t if t.dtype == dtype else t.to(dtype)


def _decode_attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          bias: torch.Tensor) -> torch.Tensor:
    """q [D, nh, hd], k/v [D, kvh, L, hd] -> [D, nh, hd].

    Grouping the query heads by their kv head makes GQA free: the g = nh / kvh queries that
    share a kv head become g query rows of that head, with no repeat of k or v. SDPA's own
    `enable_gqa` on [D, nh, 1, hd] is ~5x slower than this grouping on CPU.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    qg = q.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)   # [D, kvh, g, hd]
    if num_seqs <= SDPA_MAX_DECODES:
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias)           # [D, kvh, g, hd]
    else:
        # Many sequences: torch's CPU flash kernel runs one small query block per (sequence,
        # head), and two batched matmuls overtake it.
        scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(head_dim ** -0.5).add_(bias)
        out = torch.matmul(torch.softmax(scores, dim=-1), v)                      # [D, kvh, g, hd]
    return out.reshape(num_seqs, num_heads, head_dim)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, fused: FusedCpuOps | None = None,
                    compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """q [T, nh, hd], k/v [T, kvh, hd] (already written to the cache) -> [T, nh, hd] in q's dtype.
    With `fused` (bf16 on CPU), decodes read the paged cache in place (`cpu_fused.c`, fp32
    inside). `compute_dtype` is the dtype torch's attention computes in (fp32 on a CPU without
    AVX-512 BF16, where bf16 GEMMs are emulated, `cpu_formats.py`); None = q's."""
    outs = []
    num_decode = meta.num_decode_tokens
    decode = meta.decode
    if decode is not None and fused is not None:
        outs.append(fused.paged_decode_attention(q[:num_decode], k_cache, v_cache,
                                                 decode.block_tables, decode.context_lens,
                                                 decode.max_context_len))
    elif decode is not None:
        tables = decode.block_tables
        qd, kd, vd, bias = _in(compute_dtype, q[:num_decode], _gather(k_cache, tables),
                               _gather(v_cache, tables), decode.bias)     # kd, vd [D, kvh, L, hd]
        if q.device.type == "cpu":
            outs.append(_back(_decode_attention_cpu(qd, kd, vd, bias), q.dtype))
        else:
            out = F.scaled_dot_product_attention(qd.unsqueeze(2), kd, vd, attn_mask=bias,
                                                 enable_gqa=True)
            outs.append(_back(out.squeeze(2), q.dtype))                   # [D, nh, hd]
    pre = meta.prefill
    if pre is not None:
        qp = q[num_decode:]
        if pre.block_tables is None:       # one chunk, nothing cached before it
            qc, kc, vc = _in(compute_dtype, qp.transpose(0, 1).unsqueeze(0),
                             k[num_decode:].transpose(0, 1).unsqueeze(0),
                             v[num_decode:].transpose(0, 1).unsqueeze(0))
            out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)
            outs.append(_back(out[0].transpose(0, 1), q.dtype))           # [n, nh, hd]
        else:
            num_chunks, (_, nh, hd) = pre.block_tables.shape[0], qp.shape
            grid = qp.new_zeros(num_chunks * pre.max_chunk_len, nh, hd).index_copy_(0, pre.pad_index, qp)
            grid = grid.view(num_chunks, pre.max_chunk_len, nh, hd).transpose(1, 2)  # [P, nh, n, hd]
            gc, kc, vc = _in(compute_dtype, grid, _gather(k_cache, pre.block_tables),
                             _gather(v_cache, pre.block_tables))
            out = F.scaled_dot_product_attention(gc, kc, vc, attn_mask=pre.mask,
                                                 enable_gqa=True)         # [P, nh, n, hd]
            outs.append(_back(out.transpose(1, 2).reshape(-1, nh, hd)
                              .index_select(0, pre.pad_index), q.dtype))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
