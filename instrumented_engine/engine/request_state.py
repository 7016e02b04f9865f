"""One running request as the step loop holds it, and what one sampled token does to it.

A sampled token is appended (and fed to the request's grammar), then decides whether the
request goes on: a stop token ends it without text, a stop string or a complete grammar after
its text, `max_tokens` or the model's length with it. What the token means for the timeline
(first token, first text) and finishing the sequence stay the engine's
(`instrumented_engine/engine/llm_engine.py`): they need its recorder and its scheduler.

With a toy byte-level vocabulary (one token per byte):

>>> import tokenizers
>>> from tokenizers import decoders, models, pre_tokenizers
>>> from instrumented_engine.engine.sampling import SamplingParams
>>> alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
>>> backend = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
>>> backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
>>> backend.decoder = decoders.ByteLevel()
>>> tokenizer = Tokenizer(backend, bos_token_id=None, eos_token_id=None)
>>> seq = Sequence("r1", [0], SamplingParams(max_tokens=2), block_size=16)
>>> state = RequestState.start(seq, tokenizer, eos_token_ids=(), device="cpu")
>>> [state.advance(t, max_model_len=64) for t in tokenizer.encode("Hi")]
[('H', None), ('i', <SequenceStatus.FINISHED_LENGTH: 'length'>)]
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from instrumented_engine.engine.detokenizer import IncrementalDetokenizer
from instrumented_engine.engine.sampler import make_generator
from instrumented_engine.engine.sequence import Sequence, SequenceStatus
from instrumented_engine.model.tokenizer import Tokenizer


@dataclass(slots=True)
class RequestState:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    stop_token_ids: frozenset[int]
    has_text: bool = False   # its first text is out (the recorder's `first_text`)

    @classmethod
    def start(cls, seq: Sequence, tokenizer: Tokenizer, eos_token_ids: Iterable[int],
              device: torch.device | str) -> RequestState:
        """The state of `seq`, just admitted: its stop tokens are its own and, unless it
        ignores EOS, the model's."""
        sampling = seq.sampling
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids.update(eos_token_ids)
        detok = IncrementalDetokenizer(tokenizer, sampling.stop, sampling.skip_special_tokens)
        return cls(seq, detok, make_generator(sampling, device), frozenset(stop_ids))

    def advance(self, token_id: int, max_model_len: int) -> tuple[str, SequenceStatus | None]:
        """Append `token_id`: the text it releases, and how the request finished (None: not
        yet). The sequence is not finished here: its KV blocks are the engine's to free."""
        seq = self.seq
        seq.append_token(token_id)
        if seq.grammar is not None:
            seq.grammar.accept(token_id)
        status = None
        text = ""
        if token_id in self.stop_token_ids:
            status = SequenceStatus.FINISHED_STOPPED
        else:
            text = self.detokenizer.push(token_id)
            if self.detokenizer.stopped or (seq.grammar is not None and seq.grammar.complete):
                status = SequenceStatus.FINISHED_STOPPED
        if status is None and (seq.num_output_tokens >= seq.sampling.max_tokens
                               or seq.num_tokens >= max_model_len):
            status = SequenceStatus.FINISHED_LENGTH
        if status is not None and not self.detokenizer.stopped:
            text += self.detokenizer.flush()
        return text, status
