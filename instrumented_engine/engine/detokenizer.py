"""Turns generated token ids into printable text, one token at a time.

Two things make a token's text not printable yet: it ends inside a UTF-8 character (SmolLM2
spells `你好` as four byte-level tokens), or it might be the start of a stop string. Such text is
held back until the next token settles it; `flush()` releases what is left at the end.

Byte-level vocabularies (every GGUF we load) decode in O(1) per token: each id's raw bytes are
precomputed and fed to an incremental UTF-8 decoder. Other vocabularies (SentencePiece with byte
fallback) re-decode a window of the last few tokens, as vLLM's detokenizer does.
"""
from __future__ import annotations

import codecs
import enum
from typing import Protocol

from instrumented_engine.model.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"


class _TextStream(Protocol):
    def feed(self, token_id: int) -> str: ...
    def finish(self) -> str: ...
    def has_pending(self) -> bool: ...


class _ByteStream:
    """Raw bytes per token through an incremental UTF-8 decoder: O(token length) per push."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        assert tokenizer.token_bytes is not None
        self._token_bytes = tokenizer.token_bytes
        self._skipped_ids = tokenizer.special_ids if skip_special_tokens else frozenset()
        # errors="replace" gives the same U+FFFD placement as the Rust decoder's from_utf8_lossy.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        if token_id in self._skipped_ids or not 0 <= token_id < len(self._token_bytes):
            return ""  # out-of-vocab ids (padded embedding rows) decode to nothing, as in `tokenizers`
        return self._decoder.decode(self._token_bytes[token_id])

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)

    def has_pending(self) -> bool:
        return bool(self._decoder.getstate()[0])


class _WindowStream:
    """Re-decodes only the tokens since the last emitted text (vLLM's prefix/read offsets)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []  # the window: context tokens, then tokens not yet emitted
        self._read_offset = 0      # ids[:read_offset] are context whose text is already out
        self._prefix_text = ""     # decode(ids[:read_offset]), to diff against

    def _decode_window(self) -> str:
        return self._tokenizer.decode(self._ids, self._skip_special_tokens)

    def feed(self, token_id: int) -> str:
        self._ids.append(token_id)
        full_text = self._decode_window()
        if len(full_text) <= len(self._prefix_text) or full_text.endswith(_REPLACEMENT_CHAR):
            return ""  # an incomplete character: wait for the bytes that finish it
        new_text = full_text[len(self._prefix_text):]
        # The tokens just emitted become the next window's context; older ones are dropped,
        # so work and memory per token stay bounded.
        del self._ids[:self._read_offset]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode_window()
        return new_text

    def finish(self) -> str:
        new_text = self._decode_window()[len(self._prefix_text):]
        self._ids.clear()
        self._read_offset, self._prefix_text = 0, ""
        return new_text

    def has_pending(self) -> bool:
        return self._read_offset < len(self._ids)


class DetokenizerStatus(enum.Enum):
    ACTIVE = "active"
    STOPPED = "stopped"    # a stop string matched; nothing more is emitted
    FINISHED = "finished"  # flush() was called


class IncrementalDetokenizer:
    """Per-sequence streaming decoder with stop strings.

    With a toy byte-level vocabulary (one token per byte; SmolLM2 behaves the same with fewer
    tokens), a character is held back until its last byte, and text that may start a stop
    string until the next token settles it:

    >>> import tokenizers
    >>> from tokenizers import decoders, models, pre_tokenizers
    >>> alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    >>> backend = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    >>> backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    >>> backend.decoder = decoders.ByteLevel()
    >>> tokenizer = Tokenizer(backend, bos_token_id=None, eos_token_id=None)
    >>> detok = IncrementalDetokenizer(tokenizer, stop=("\\n\\n",))
    >>> [detok.push(t) for t in tokenizer.encode("你好\\n")]       # 3 bytes each, then a maybe-stop
    ['', '', '你', '', '', '好', '']
    >>> detok.flush(), detok.text
    ('\\n', '你好\\n')
    >>> detok = IncrementalDetokenizer(tokenizer, stop=("\\n\\n",))
    >>> "".join(detok.push(t) for t in tokenizer.encode("Hi\\n\\nbye")), detok.stopped, detok.text
    ('Hi', True, 'Hi')
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = (),
                 skip_special_tokens: bool = True) -> None:
        byte_level = tokenizer.token_bytes is not None
        self._stream: _TextStream = (_ByteStream if byte_level else _WindowStream)(tokenizer, skip_special_tokens)
        self._stops = tuple(s for s in stop if s)  # an empty stop string would match at once
        # Every proper prefix of a stop string: text ending in one of these must be held back.
        self._stop_prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._max_stop_prefix_len = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._pieces: list[str] = []
        self._num_pending_tokens = 0
        self.status = DetokenizerStatus.ACTIVE

    @property
    def stopped(self) -> bool:
        return self.status is DetokenizerStatus.STOPPED

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens pushed since the last moment all text was out (0 when nothing is held)."""
        return self._num_pending_tokens

    def push(self, token_id: int) -> str:
        """The text that became printable with this token, possibly ''."""
        if self.status is DetokenizerStatus.FINISHED:
            raise RuntimeError("push() after flush()")
        if self.status is DetokenizerStatus.STOPPED:
            return ""
        self._num_pending_tokens += 1
        out = self._release(self._stream.feed(token_id), final=False)
        if not self._held and not self._stream.has_pending():
            self._num_pending_tokens = 0
        return out

    def flush(self) -> str:
        """At the end of generation: everything still held back (a lone byte becomes U+FFFD)."""
        if self.status is not DetokenizerStatus.ACTIVE:
            return ""
        out = self._release(self._stream.finish(), final=True)
        if self.status is DetokenizerStatus.ACTIVE:
            self.status = DetokenizerStatus.FINISHED
        self._num_pending_tokens = 0
        return out

    def _release(self, new_text: str, final: bool) -> str:
        text = self._held + new_text
        stop_start = self._first_stop_start(text)
        if stop_start is not None:
            self.status = DetokenizerStatus.STOPPED
            out, self._held = text[:stop_start], ""
        else:
            keep = 0 if final else self._held_back_len(text)
            out, self._held = text[:len(text) - keep], text[len(text) - keep:]
        if out:
            self._pieces.append(out)
        return out

    def _first_stop_start(self, text: str) -> int | None:
        """Start of the stop string that completes first (earliest end; longest on a tie).

        Choosing by end makes the result independent of how text is split into tokens.
        """
        best: tuple[int, int] | None = None
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best):
                best = (start + len(stop), start)
        return None if best is None else best[1]

    def _held_back_len(self, text: str) -> int:
        """Length of the longest tail of `text` that a stop string could still complete."""
        for length in range(min(len(text), self._max_stop_prefix_len), 0, -1):
            if text[-length:] in self._stop_prefixes:
                return length
        return 0
