"""A readable Llama (also SmolLM, Qwen2-style GQA) that reads and writes a paged KV cache.

Shapes in comments: T = new tokens in the step (all sequences flattened), H = hidden size,
nh / kvh = query / key-value heads, hd = head dim, D = decoding sequences, n = chunk length,
L = padded context length, bs = block size.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling (`rope_type="llama3"`) or plain `"linear"` scaling."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """Architecture of a Llama-family model.

    >>> ModelConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2,
    ...             num_heads=4, num_kv_heads=2).head_dim
    16
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0                      # 0 = hidden_size // num_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False           # biases on q/k/v (Qwen2; Llama's attention_bias)
    o_proj_bias: bool = False              # Llama's attention_bias also biases o_proj
    rope_scaling: RopeScaling | None = None
    rope_freq_factors: tuple[float, ...] | None = None   # llama.cpp's precomputed rope_freqs

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")


@dataclass(slots=True, frozen=True)
class PrefillChunk:
    """One multi-token chunk of one sequence: tokens [token_start, token_end) of the step."""

    token_start: int
    token_end: int
    block_ids: torch.Tensor | None     # [ceil(ctx / bs)] blocks to read; None = no cached prefix
    context_len: int                   # start_pos + n
    mask: torch.Tensor | None          # [n, ctx] bool, True = may attend; None = plain causal


@dataclass(slots=True, frozen=True)
class AttentionMetadata:
    """Everything attention needs, built once per step by the model runner, used by every layer.

    Tokens are ordered decodes first (one token each), then the prefill chunks.
    """

    slot_mapping: torch.Tensor               # [T] flat cache slot (block * bs + offset) per token
    num_decode_tokens: int                   # D
    decode_block_tables: torch.Tensor | None # [D, max_blocks], padded with block 0
    decode_mask: torch.Tensor | None         # [D, 1, 1, max_blocks * bs] bool, True = attend
    prefills: tuple[PrefillChunk, ...]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [hd / 2] in float64, with llama3/linear scaling applied."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float64)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: keep high frequencies, divide low ones by factor, blend in between
    # (same formula as transformers' _compute_llama3_parameters).
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 so bf16 activations keep their precision, like the reference.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
    """q [T, nh, hd], k/v [T, kvh, hd] (already in the cache) -> [T, nh, hd]."""
    outs = []
    num_decode = meta.num_decode_tokens
    if num_decode:
        _, bs, kvh, hd = k_cache.shape
        tables = meta.decode_block_tables.view(-1)
        # index_select, not k_cache[tables]: advanced indexing of a cache view is ~500x slower on CPU.
        # [D * max_blocks, bs, kvh, hd] -> [D, kvh, L, hd]
        kd = k_cache.index_select(0, tables).view(num_decode, -1, kvh, hd).transpose(1, 2)
        vd = v_cache.index_select(0, tables).view(num_decode, -1, kvh, hd).transpose(1, 2)
        qd = q[:num_decode].unsqueeze(2)                               # [D, nh, 1, hd]
        out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, enable_gqa=True)
        outs.append(out.squeeze(2))                                    # [D, nh, hd]
    for chunk in meta.prefills:
        qc = q[chunk.token_start:chunk.token_end].transpose(0, 1).unsqueeze(0)   # [1, nh, n, hd]
        if chunk.block_ids is None:      # no cached prefix: the chunk's own k/v, causal
            kc = k[chunk.token_start:chunk.token_end].transpose(0, 1).unsqueeze(0)
            vc = v[chunk.token_start:chunk.token_end].transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)
        else:
            kvh, hd = k_cache.shape[2:]
            ctx = chunk.context_len
            # [nb, bs, kvh, hd] -> [1, kvh, ctx, hd]
            kc = k_cache.index_select(0, chunk.block_ids).view(-1, kvh, hd)[:ctx].transpose(0, 1).unsqueeze(0)
            vc = v_cache.index_select(0, chunk.block_ids).view(-1, kvh, hd)[:ctx].transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=chunk.mask, enable_gqa=True)
        outs.append(out.squeeze(0).transpose(0, 1))                     # [n, nh, hd]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        # One fused matmul for q, k and v: fewer, larger GEMMs are faster on both CPU and GPU.
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_proj_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                meta: AttentionMetadata, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)        # [T, nh, hd]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)     # [T, kvh, hd]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_cache, v_cache = kv_cache                                  # [num_blocks, bs, kvh, hd]
        k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, v)
        out = paged_attention(q, k, v, k_cache, v_cache, meta)       # [T, nh, hd]
        return self.o_proj(out.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)            # [T, I] each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, meta, kv_cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """The decoder stack; the model runner builds its inputs (`ModelRunner.execute` calls
    `hidden = model(input_ids, positions, meta, kv_caches)`, then `compute_logits(hidden[rows])`).

    >>> model = LlamaForCausalLM(ModelConfig(vocab_size=100, hidden_size=64,
    ...     intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2))
    >>> model.init_rope(torch.device("cpu"))
    >>> model.rope_cos.shape                           # [max_position_embeddings, head_dim]
    torch.Size([2048, 16])
    >>> model.compute_logits(torch.zeros(3, 64)).shape  # hidden [N, H] -> logits [N, vocab]
    torch.Size([3, 100])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Tied models reuse the embedding matrix instead of holding a second parameter.
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)

    def init_rope(self, device: torch.device) -> None:
        """Precompute cos/sin [max_pos, hd] in fp32 (after weights are materialised)."""
        inv_freq = rope_inv_freq(self.config)
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed_tokens.weight.dtype
        self.register_buffer("rope_cos", emb.cos().to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", emb.sin().to(device=device, dtype=dtype), persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, H] before the final norm."""
        x = self.embed_tokens(input_ids)                 # [T, H]
        cos = self.rope_cos.index_select(0, positions).unsqueeze(1)   # [T, 1, hd], shared by all layers
        sin = self.rope_sin.index_select(0, positions).unsqueeze(1)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, meta, kv_cache)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (only the rows that need logits) -> logits [N, vocab]."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm(hidden), weight)


def hf_to_fused_state_dict(tensors: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Map transformers-named weights (`model.layers.0.self_attn.q_proj.weight`, ...) to ours."""
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"checkpoint has no tensor {name!r}")
        return tensors[name]

    out["embed_tokens.weight"] = take("model.embed_tokens.weight")
    out["norm.weight"] = take("model.norm.weight")
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{dst}{norm}.weight"] = take(f"{src}{norm}.weight")
        attn = f"{src}self_attn."
        out[f"{dst}self_attn.qkv_proj.weight"] = torch.cat([take(f"{attn}{p}_proj.weight") for p in "qkv"])
        if config.attention_bias:
            out[f"{dst}self_attn.qkv_proj.bias"] = torch.cat([take(f"{attn}{p}_proj.bias") for p in "qkv"])
        out[f"{dst}self_attn.o_proj.weight"] = take(f"{attn}o_proj.weight")
        if config.o_proj_bias:
            out[f"{dst}self_attn.o_proj.bias"] = take(f"{attn}o_proj.bias")
        mlp = f"{src}mlp."
        out[f"{dst}mlp.gate_up_proj.weight"] = torch.cat([take(f"{mlp}gate_proj.weight"), take(f"{mlp}up_proj.weight")])
        out[f"{dst}mlp.down_proj.weight"] = take(f"{mlp}down_proj.weight")
    return out


def build_llama(config: ModelConfig, tensors: Mapping[str, torch.Tensor],
                device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """Build the model from transformers-named weights, without a wasted random init."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = {name: t.to(device=device, dtype=dtype) for name, t in hf_to_fused_state_dict(tensors, config).items()}
    model.load_state_dict(state, strict=True, assign=True)   # adopt the tensors: no second copy
    model.init_rope(device)
    return model.eval().requires_grad_(False)
