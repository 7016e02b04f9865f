"""JSON-schema-constrained decoding: one grammar per constrained sequence, and its token mask.

A sequence whose `SamplingParams.json_schema` is set carries a `Grammar` (sequence.py). Before
each of its tokens is sampled, the grammar says which tokens may come next and every other
token's logit becomes -inf (`mask_logits`, called from the sampler on the constrained rows
only: an unconstrained sequence in the same batch is neither read nor written, and a batch
without a constrained sequence pays nothing). The sampled token is then fed to the grammar;
when the grammar is complete (the JSON value closed and nothing may follow) the sequence
stops there, without spending a step on sampling EOS.

llguidance does the work (why it and not xgrammar or outlines-core, with the numbers:
docs/reference.md, "Tool calls"). It is imported on first use, and the vocabulary's token
trie is built once per engine on the first constrained request (~0.3 s for SmolLM2's 49,152
tokens on 2 vCPUs), so an engine that is never asked for a tool call pays neither.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence as Seq

import numpy as np
import torch

from instrumented_engine.engine.errors import EngineInputError
from instrumented_engine.model.tokenizer import Tokenizer

# The JSON the grammar lets the model write: no free whitespace (a small model would spend
# tokens on blank lines), and json.dumps's default separators, so the arguments read as a
# client would write them.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Grammar:
    """One sequence's matcher: which tokens may come next, fed every token it takes."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher) -> None:
        self._matcher = matcher

    def fill_mask(self, words: np.ndarray, row: int) -> None:
        """Write the allowed tokens as bits (token t: bit t % 32 of word t // 32) into
        `words[row]`, an int32 row of ceil(vocab / 32) words."""
        view = words[row]
        self._matcher.unsafe_compute_mask_ptr(view.ctypes.data, view.nbytes)

    def accept(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}: "
                               f"{self._matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The value is closed and nothing else may follow: generation ends here."""
        return self._matcher.is_stopped()


class GrammarCompiler:
    """Compiles JSON schemas into `Grammar`s for one vocabulary. Thread-safe.

    Not a doctest (the token trie of a real vocabulary takes ~0.3 s)::

        grammars = GrammarCompiler(engine.tokenizer, vocab_size=49152, eos_token_ids=(2,))
        grammar = grammars.compile('{"type": "object", "properties": {"city": {"type": "string"}}}')
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Seq[int]) -> None:
        self._tokenizer = tokenizer
        # The logits' width: the bit mask must cover every row of the output layer.
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)
        self._eos_token_ids = [i for i in eos_token_ids if i is not None]
        self._lock = threading.Lock()
        self._lltokenizer = None

    def _trie(self):
        with self._lock:
            if self._lltokenizer is None:
                import llguidance
                self._lltokenizer = llguidance.LLTokenizer(
                    self._tokenizer.to_json(), n_vocab=self.vocab_size,
                    eos_token=self._eos_token_ids or None)
            return self._lltokenizer

    def compile(self, json_schema: str) -> Grammar:
        """A fresh grammar for one sequence; an unusable schema raises EngineInputError
        (param `json_schema`), which the server answers with a 400."""
        import llguidance
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json_schema,
                                                                    defaults=JSON_LAYOUT)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise EngineInputError(f"the JSON schema cannot constrain decoding: {exc}",
                                   param="json_schema") from None
        matcher = llguidance.LLMatcher(self._trie(), grammar)
        if matcher.is_error():
            raise EngineInputError("the JSON schema cannot constrain decoding: "
                                   f"{matcher.get_error()[:300]}", param="json_schema")
        return Grammar(matcher)


def mask_logits(logits: torch.Tensor, rows: list[tuple[int, Grammar]]) -> list[int]:
    """In place, -inf on every token each listed row's grammar forbids; the other rows of
    `logits` are untouched. Returns the rows whose grammar allows no token at all (a dead
    end: sampling them would pick an arbitrary token).

    >>> class Only:                      # a stand-in grammar that allows token 1 alone
    ...     def fill_mask(self, words, row): words[row, 0] = 0b10
    >>> logits = torch.zeros(2, 3)
    >>> mask_logits(logits, [(1, Only())]), logits.tolist()
    ([], [[0.0, 0.0, 0.0], [-inf, 0.0, -inf]])
    """
    vocab = logits.shape[-1]
    words = np.zeros((len(rows), -(-vocab // 32)), dtype=np.int32)
    for j, (_, grammar) in enumerate(rows):
        grammar.fill_mask(words, j)
    allowed = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    forbidden = torch.from_numpy(allowed == 0).to(logits.device)
    index = [i for i, _ in rows]
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))
    return [i for i, any_allowed in zip(index, allowed.any(axis=1)) if not any_allowed]
