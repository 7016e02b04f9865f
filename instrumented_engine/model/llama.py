"""A readable Llama (also SmolLM, Qwen2-style GQA) that reads and writes a paged KV cache.

Shapes in comments: T = new tokens in the step (all sequences flattened), H = hidden size,
nh / kvh = query / key-value heads, hd = head dim. Attention over the cache is `attention.py`;
the linear layers' CPU kernels are `linear.py`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from instrumented_engine.model import cpu_fused
from instrumented_engine.model.attention import AttentionMetadata, paged_attention
from instrumented_engine.model.cpu_formats import CpuPlan
from instrumented_engine.model.cpu_fused import FusedCpuOps
from instrumented_engine.model.decode_fast import DecodeFastPath
from instrumented_engine.model.linear import CpuKernels, Linear


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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [T, heads, hd] rotated by position: x·cos + rotate_half(x)·sin, with rotate_half(x) =
    (-x2, x1) written as the halves swapped (one flip) times the sign folded into `sin_signed`.

    >>> x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    >>> apply_rope(x, torch.zeros(1, 1, 4), torch.tensor([[[-1.0, -1.0, 1.0, 1.0]]]))
    tensor([[[-3., -4.,  1.,  2.]]])
    """
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin_signed)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.fused: FusedCpuOps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel; it normalises bf16 input in fp32, as the reference does.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream x plus a layer's output delta (None: nothing to add yet) ->
        (the new stream, its norm). The fused op updates x in place."""
        if self.fused is not None:
            return self.fused.add_rms_norm(x, delta, self.weight, self.eps)
        if delta is not None:
            x = x + delta
        return x, self(x)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        # One fused matmul for q, k and v: fewer, larger GEMMs are faster on both CPU and GPU.
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.attention_bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.o_proj_bias)
        self.fused: FusedCpuOps | None = None
        self.fused_decode: FusedCpuOps | None = None     # where its attention kernel fits
        self.attention_dtype: torch.dtype | None = None   # None: SDPA in the model's dtype

    def use_fused(self, fused: FusedCpuOps | None) -> None:
        self.fused = fused
        fits = fused is not None and fused.decode_attention_fits(
            self.num_heads, self.num_kv_heads, self.head_dim)
        self.fused_decode = fused if fits else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
                meta: AttentionMetadata, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        num_tokens, (q_size, kv_size, _) = x.shape[0], self.split_sizes
        qkv = self.qkv_proj(x)
        k_cache, v_cache = kv_cache                                  # [num_blocks, bs, kvh, hd]
        if self.fused is not None:          # rope and both cache writes in one call, in place
            self.fused.rope_store_kv(qkv, self.num_heads, self.num_kv_heads, cos, sin_signed,
                                     meta.slot_mapping, k_cache, v_cache)
            q, k, v = (t.view(num_tokens, -1, self.head_dim) for t in qkv.split(self.split_sizes, 1))
        else:
            # q and k are rotated together: one rope over [T, nh + kvh, hd] instead of two.
            qk = apply_rope(qkv[:, :q_size + kv_size].view(num_tokens, -1, self.head_dim), cos, sin_signed)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)   # [T, nh, hd], [T, kvh, hd]
            v = qkv[:, q_size + kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
            k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, k)
            v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, meta.slot_mapping, v)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.fused_decode,
                              self.attention_dtype)                           # [T, nh, hd]
        return self.o_proj(out.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.fused: FusedCpuOps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_up_proj(x)))

    def fuses_activation(self, rows: int) -> bool:
        """Whether `activation` of `rows` rows is the one fused C call (torch's rounding):
        only for a few rows, where torch's two threads do not win (cpu_fused.SILU_MUL_MAX_ROWS)."""
        return self.fused is not None and rows <= cpu_fused.SILU_MUL_MAX_ROWS

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) · up of gate_up [T, 2I]."""
        if self.fuses_activation(gate_up.shape[0]):
            return self.fused.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)                          # [T, I] each
        return F.silu(gate) * up


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, delta, cos, sin_signed, meta, kv_cache):
        """The residual stream x and the previous layer's output delta, not yet added: each
        residual add happens inside the norm that follows it -> (x, this layer's delta)."""
        x, h = self.input_layernorm.add_and_norm(x, delta)
        x, h = self.post_attention_layernorm.add_and_norm(
            x, self.self_attn(h, cos, sin_signed, meta, kv_cache))
        return x, self.mlp(h)


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
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, bias=False)
        self.tied_head_kernels: CpuKernels | None = None
        # Decode-only steps on the CPU with every fused op: the same kernels without the
        # per-layer Python (decode_fast.py); set by prepare_cpu_kernels where it fits.
        self.decode_fast: DecodeFastPath | None = None

    def prepare_cpu_kernels(self, plan: CpuPlan) -> None:
        """Build the CPU fast paths of every linear layer (`linear.py`) as the plan says: the
        decoder layers' weight-only format (a GGUF's Q4_1 layers), the head's (a GGUF keeps the
        embedding at 8 bits), the dense GEMM of big steps; and the fused norm, rope and
        decode-attention ops (`cpu_fused.py`) where the plan has them and they build, and with
        them the decode-only step's flat loop (`decode_fast.py`)."""
        fused = cpu_fused.load(plan.isa) if plan.fused_ops else None
        for module in self.layers.modules():
            if isinstance(module, (RMSNorm, MLP)):
                module.fused = fused
            elif isinstance(module, Attention):
                module.use_fused(fused)
                module.attention_dtype = plan.attention_dtype
        for module in self.layers.modules():
            if isinstance(module, Linear):
                module.prepare(dense=plan.dense, low_bit=plan.layers, fused=fused)
        if self.lm_head is not None:
            self.lm_head.prepare(dense=plan.dense, low_bit=plan.head, fused=fused)
        elif plan.dense != "dense" or plan.head:
            self.tied_head_kernels = CpuKernels.build(self.embed_tokens.weight, dense=plan.dense,
                                                      low_bit=plan.head, fused=fused)
        self.decode_fast = DecodeFastPath.build(self, fused)

    def init_rope(self, device: torch.device) -> None:
        """Precompute cos/sin [max_pos, hd] in fp32 (after weights are materialised)."""
        inv_freq = rope_inv_freq(self.config)
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed_tokens.weight.dtype
        half = emb.shape[-1] // 2
        sign = torch.cat((-torch.ones(half, dtype=torch.float64), torch.ones(half, dtype=torch.float64)))
        self.register_buffer("rope_cos", emb.cos().to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin_signed", (emb.sin() * sign).to(device=device, dtype=dtype),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, H] before the final norm."""
        if self.decode_fast is not None and DecodeFastPath.serves(meta):
            return self.decode_fast.forward(input_ids, positions, meta, kv_caches)
        x = self.embed_tokens(input_ids)                 # [T, H]
        cos = self.rope_cos.index_select(0, positions).unsqueeze(1)   # [T, 1, hd], shared by all layers
        sin_signed = self.rope_sin_signed.index_select(0, positions).unsqueeze(1)
        delta = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, delta = layer(x, delta, cos, sin_signed, meta, kv_cache)
        return x + delta

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (only the rows that need logits) -> logits [N, vocab]."""
        hidden = self.norm(hidden)
        if self.lm_head is not None:
            return self.lm_head(hidden)
        if self.tied_head_kernels is not None:
            return self.tied_head_kernels(hidden, None)
        return F.linear(hidden, self.embed_tokens.weight)


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
