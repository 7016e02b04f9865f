"""The model's tokenizer, built from a GGUF file's own metadata or from a Hugging Face folder.

A GGUF carries no `tokenizer.json`: it stores the vocabulary, the merges, the token types and
the name of the pre-tokenizer (`tokenizer.ggml.pre`) under llama.cpp's keys. We rebuild the same
byte-level BPE with the `tokenizers` library, so encoding runs in Rust, and keep each token's raw
bytes so the incremental detokenizer never has to re-decode a sequence.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

# Texts at least this long are encoded through `encode_batch_fast`, which releases the GIL while
# the Rust code runs (`encode` holds it throughout, stalling every other Python thread, the
# event loop included); below it, `encode` is cheaper than the batch call's setup.
_RELEASE_GIL_MIN_CHARS = 8192

# llama.cpp's token types (llama_token_type in llama.h).
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# GPT-2's split, which `pre_tokenizers.ByteLevel(use_regex=True)` applies itself.
_GPT2_SPLIT = None
# From llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe): the regexes each `tokenizer.ggml.pre`
# applies before GPT-2's. "smollm" (and the StarCoder family it shares a vocabulary with) first
# isolates every digit, like the `Digits(individual_digits=True)` of SmolLM2's own tokenizer.json.
_DIGITS_SPLIT = r"\p{N}"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
                    _DIGITS_SPLIT),
    **dict.fromkeys(("gpt2", "gpt-2", "mpt", "olmo", "jais"), _GPT2_SPLIT),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    byte_to_char = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in byte_to_char:
            byte_to_char[b] = chr(256 + extra)
            extra += 1
    return byte_to_char


_BYTE_TO_CHAR = _byte_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _spell_in_byte_alphabet(token: str) -> str:
    """A GGUF may store a token as plain text; the BPE model needs it in the byte alphabet."""
    if all(c in _CHAR_TO_BYTE for c in token):
        return token
    return "".join(_BYTE_TO_CHAR[b] for b in token.encode("utf-8"))


def _token_raw_bytes(token: str) -> bytes:
    # Mirrors the ByteLevel decoder: a token with any character outside the alphabet is its UTF-8.
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE_TOKENIZER_SPLITS:
        raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}; known: {sorted(_PRE_TOKENIZER_SPLITS)}")
    split = _PRE_TOKENIZER_SPLITS[pre]
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # The digit split runs before GPT-2's regex; the full llama3/qwen2 regexes replace it.
    gpt2_after = split == _DIGITS_SPLIT
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_after),
    ])


def _gguf_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _added_token_content(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens either as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_hf_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return template


class Tokenizer:
    """Encode prompts and decode generated ids with the model's own vocabulary.

    Not a doctest: building SmolLM2's 49k-token vocabulary from its GGUF takes seconds::

        from instrumented_engine.model.loader import default_model_path
        tok = Tokenizer.from_gguf(gguf.GGUFReader(default_model_path()))
        tok.encode("<|im_start|>user\\nHi")    # [1, 4093, 198, 26843]
        tok.decode([26843])                    # 'Hi'
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        add_bos_token: bool = False,
        chat_template_source: str | None = None,
        byte_level: bool = True,
    ) -> None:
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos_token = add_bos_token
        self.chat_template_source = chat_template_source
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        self.all_special_ids: tuple[int, ...] = tuple(sorted(i for i, t in added.items() if t.special))
        self.special_ids: frozenset[int] = frozenset(self.all_special_ids)
        self.special_tokens: tuple[str, ...] = tuple(added[i].content for i in self.all_special_ids)
        # The same vocabulary with special-token strings read as plain text (client text).
        self._plain_backend = tokenizers.Tokenizer.from_str(backend.to_str())
        self._plain_backend.encode_special_tokens = True
        # Raw bytes of every id, computed once: the detokenizer's O(1) path. None when the
        # decoder is not byte-level (e.g. SentencePiece with byte fallback): it then re-decodes a window.
        self.token_bytes: tuple[bytes, ...] | None = None
        if byte_level:
            self.token_bytes = tuple(_token_raw_bytes(backend.id_to_token(i) or "") for i in range(self.vocab_size))
        # The most prompt bytes one token can stand for: a text of more than n times this many
        # UTF-8 bytes is surely more than n tokens, so its size alone can refuse it. A token's
        # own spelling (byte fallback "<0x41>", SentencePiece's 3-byte "▁") is never shorter
        # than the text it encodes, so the spelling's length is a safe bound.
        spellings = (self.token_bytes if self.token_bytes is not None else
                     tuple((backend.id_to_token(i) or "").encode("utf-8")
                           for i in range(self.vocab_size)))
        self.max_token_bytes: int = max(1, max(map(len, spellings), default=1))

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self.id_to_token(self.eos_token_id)

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """Build from a `gguf.GGUFReader`; only byte-level BPE (`tokenizer.ggml.model = gpt2`)."""
        model_kind = _gguf_value(reader, "tokenizer.ggml.model")
        if model_kind != "gpt2":
            raise ValueError(f"only byte-level BPE GGUF tokenizers are supported, got {model_kind!r}")
        tokens: list[str] = _gguf_value(reader, "tokenizer.ggml.tokens")
        token_types: list[int] = _gguf_value(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in _gguf_value(reader, "tokenizer.ggml.merges") or ()]
        vocab = {_spell_in_byte_alphabet(t): i for i, t in enumerate(tokens)}
        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        backend.pre_tokenizer = _byte_level_pre_tokenizer(_gguf_value(reader, "tokenizer.ggml.pre") or "gpt2")
        backend.decoder = decoders.ByteLevel()
        # Added tokens are matched whole in the text before pre-tokenization, as llama.cpp does.
        backend.add_special_tokens([
            AddedToken(t, normalized=False, special=True)
            for t, kind in zip(tokens, token_types) if kind == _TOKEN_TYPE_CONTROL
        ])
        backend.add_tokens([
            AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, token_types) if kind == _TOKEN_TYPE_USER_DEFINED
        ])
        return cls(
            backend,
            bos_token_id=_gguf_value(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_id=_gguf_value(reader, "tokenizer.ggml.eos_token_id"),
            add_bos_token=bool(_gguf_value(reader, "tokenizer.ggml.add_bos_token")),
            chat_template_source=_gguf_value(reader, "tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`) from a folder."""
        folder = Path(path)
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        bos, eos = (_added_token_content(config.get(k)) for k in ("bos_token", "eos_token"))
        bos_token_id = None if bos is None else backend.token_to_id(bos)
        add_bos = config.get("add_bos_token")
        if add_bos is None and bos_token_id is not None:
            # No flag: the tokenizer.json post-processor is what the model's authors meant.
            add_bos = backend.encode("a", add_special_tokens=True).ids[:1] == [bos_token_id]
        decoder_kind = json.loads(backend.to_str()).get("decoder") or {}
        return cls(
            backend,
            bos_token_id=bos_token_id,
            eos_token_id=None if eos is None else backend.token_to_id(eos),
            add_bos_token=bool(add_bos),
            chat_template_source=_read_hf_chat_template(folder, config),
            byte_level=decoder_kind.get("type") == "ByteLevel",
        )

    def encode(self, text: str, add_bos: bool | None = None, *,
               parse_special: bool = True) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids, unless
        `parse_special=False` (client text: "<|im_start|>" is then its characters).

        `add_bos=None` follows the model's config; a rendered chat prompt that already
        spells its BOS should pass `add_bos=False`. Text that is not valid Unicode (a lone
        UTF-16 surrogate from a JSON escape) raises ValueError.
        """
        backend = self._backend if parse_special else self._plain_backend
        try:
            if len(text) >= _RELEASE_GIL_MIN_CHARS:
                # `_fast` (tokenizers >= 0.21): no character offsets, which nothing here
                # reads (half the time).
                batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
                ids = batch([text], add_special_tokens=False)[0].ids
            else:
                ids = backend.encode(text, add_special_tokens=False).ids
        except TypeError:  # the binding's answer to a str it cannot turn into UTF-8
            text.encode("utf-8")  # raises UnicodeEncodeError (a ValueError) naming the place
            raise
        if (self.add_bos_token if add_bos is None else add_bos) and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def to_json(self) -> str:
        """The vocabulary as `tokenizer.json` text (what a grammar library builds its token
        trie from: instrumented_engine/engine/grammar.py)."""
        return self._backend.to_str()

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)
