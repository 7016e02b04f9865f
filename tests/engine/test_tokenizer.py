"""Tokenizer built from the GGUF's own metadata vs transformers' GGUF tokenizer."""
from __future__ import annotations

import json

import gguf
import pytest
import regex

from instrumented_engine.model.tokenizer import Tokenizer


CORPUS = [
    "Hello, world! How are you doing today?",
    "The capital of France is Paris.",
    "你好，世界！这是一个测试。",
    "日本語のテキストと한국어 텍스트",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\n\treturn sum;",
    "Emoji: 😀🎉👍🏽 and a family 👨‍👩‍👧‍👦 and flags 🇫🇷",
    "spaces:     five, then\ttab\t\ttwo tabs, then\n\n\nthree newlines",
    " " * 37 + "x" + "\n" * 25 + "\t" * 9 + "y   ",
    "   leading and trailing   ",
    "digits 0123456789 and 3.14159 and 1,000,000 and 42nd",
    "a  1 x\n\n 42 y\t\t7",  # whitespace right before digits: see test_whitespace_before_digits
    "It's they're we've I'm you'll he'd",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "text<|endoftext|>more text<file_sep>code<jupyter_code>x=1",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé àccents — and “quotes” … ñ",
    "\u200b zero width, \u00a0 nbsp, \r\n crlf",
    "",
]


def _reference_ids(reference, text: str) -> list[int]:
    """llama.cpp's `smollm` pre-tokenizer isolates every digit before GPT-2's split (as SmolLM2's
    own tokenizer.json does with Digits(individual_digits)); transformers' GGUF loader has no
    entry for `smollm` and applies only GPT-2's split. Splitting at digits first and encoding
    each piece with transformers gives the model's tokenization with transformers' BPE."""
    pieces = [p for p in regex.split(r"(\p{N})", text) if p]
    return [i for piece in pieces for i in reference.encode(piece, add_special_tokens=False)]


@pytest.mark.parametrize("text", CORPUS)
def test_encode_matches_transformers(tokenizer, reference, text):
    assert tokenizer.encode(text) == _reference_ids(reference, text)
    if not regex.search(r"\s\p{N}", text):
        assert tokenizer.encode(text) == reference.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("text", CORPUS)
def test_decode_matches_transformers(tokenizer, reference, text, skip_special_tokens):
    ids = tokenizer.encode(text)
    expected = reference.decode(ids, skip_special_tokens=skip_special_tokens)
    assert tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) == expected
    if not skip_special_tokens:
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_whitespace_before_digits(tokenizer, reference):
    # Two spaces then a digit: the digit split leaves "  " whole, one merged token (llama.cpp);
    # GPT-2's regex alone would attach one space to the digit and emit two single spaces.
    double_space = tokenizer.token_to_id("ĠĠ")
    assert tokenizer.encode("a  1") == [tokenizer.token_to_id("a"), double_space, tokenizer.token_to_id("1")]
    assert reference.encode("a  1", add_special_tokens=False) != tokenizer.encode("a  1")


def test_chat_prompt_special_tokens_are_single_ids(tokenizer, reference):
    prompt = reference.apply_chat_template([{"role": "user", "content": "Hi there"}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt)
    assert ids == reference.encode(prompt, add_special_tokens=False)
    assert ids.count(tokenizer.token_to_id("<|im_start|>")) == prompt.count("<|im_start|>") == 3
    assert tokenizer.decode(ids, skip_special_tokens=True) == prompt.replace("<|im_start|>", "").replace(
        "<|im_end|>", "")


def test_chinese_is_four_byte_tokens(tokenizer):
    ids = tokenizer.encode("你好")
    assert len(ids) == 4
    for token_id in ids:  # none is a whole UTF-8 character on its own
        with pytest.raises(UnicodeDecodeError):
            tokenizer.token_bytes[token_id].decode("utf-8")
    assert b"".join(tokenizer.token_bytes[i] for i in ids) == "你好".encode()


def test_metadata(tokenizer, reference):
    assert tokenizer.vocab_size == len(reference) == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert (tokenizer.bos_token, tokenizer.eos_token) == (reference.bos_token, reference.eos_token)
    assert tokenizer.eos_token == "<|im_end|>"
    assert set(reference.all_special_ids) <= set(tokenizer.all_special_ids)
    assert all(reference.convert_ids_to_tokens(i) == tokenizer.id_to_token(i) for i in tokenizer.all_special_ids)
    assert tokenizer.chat_template_source == reference.chat_template
    assert tokenizer.add_bos_token is False
    assert tokenizer.encode("hi")[0] != tokenizer.bos_token_id
    assert tokenizer.encode("hi", add_bos=True)[0] == tokenizer.bos_token_id
    assert tokenizer.token_to_id("no-such-token-xyz") is None


def test_token_bytes_cover_vocab(tokenizer, reference):
    assert len(tokenizer.token_bytes) == tokenizer.vocab_size
    for token_id in range(0, tokenizer.vocab_size, 97):
        raw = tokenizer.token_bytes[token_id]
        assert reference.decode([token_id]) == raw.decode("utf-8", errors="replace")


def test_from_hf_dir_roundtrip(tokenizer, reference, tmp_path):
    reference.save_pretrained(tmp_path)
    loaded = Tokenizer.from_hf_dir(tmp_path)
    assert loaded.chat_template_source == reference.chat_template
    assert (loaded.bos_token, loaded.eos_token) == (reference.bos_token, reference.eos_token)
    assert loaded.token_bytes == tokenizer.token_bytes
    assert loaded.all_special_ids == tokenizer.all_special_ids
    for text in CORPUS:  # transformers' own tokenizer.json, so plain equality
        assert loaded.encode(text) == reference.encode(text, add_special_tokens=False)


def test_from_hf_dir_config_template_and_add_bos(reference, tmp_path):
    reference.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(chat_template=[{"name": "default", "template": "{{ messages }}"}], add_bos_token=True,
                  bos_token={"content": "<|endoftext|>", "special": True})
    config_path.write_text(json.dumps(config))
    loaded = Tokenizer.from_hf_dir(tmp_path)
    assert loaded.chat_template_source == "{{ messages }}"
    assert loaded.bos_token_id == 0
    assert loaded.encode("hi")[0] == 0


def test_rejects_non_byte_level_gguf(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "spm.gguf", "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ValueError, match="byte-level"):
        Tokenizer.from_gguf(gguf.GGUFReader(tmp_path / "spm.gguf"))
