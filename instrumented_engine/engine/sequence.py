"""A sequence: one request's tokens and how far the engine has computed them.

Token accounting, not phases (vLLM v1): a sequence is "prefilling" while
`num_computed_tokens < num_tokens - 1` and "decoding" when one token is left,
so chunked prefill is nothing more than scheduling fewer tokens.
"""
from __future__ import annotations

import enum
import itertools

from instrumented_engine.engine.grammar import Grammar
from instrumented_engine.engine.sampling import SamplingParams

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # the engine failed on this sequence alone (not the client's fault)

    @property
    def is_finished(self) -> bool:
        return self in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                        SequenceStatus.FINISHED_ABORTED, SequenceStatus.FINISHED_ERROR)

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.is_finished else None


class Sequence:
    """Prompt + generated token ids, the KV blocks that hold them, and progress.

    >>> s = Sequence("req-1", [1, 2, 3], SamplingParams(max_tokens=4), block_size=16)
    >>> s.num_tokens, s.num_computed_tokens, s.num_output_tokens
    (3, 0, 0)
    """

    __slots__ = ("seq_id", "request_id", "token_ids", "num_prompt_tokens", "sampling",
                 "block_size", "status", "num_computed_tokens", "num_cached_tokens",
                 "block_table", "num_preemptions", "arrival_ns", "looked_up", "grammar")

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 block_size: int, arrival_ns: int = 0, grammar: Grammar | None = None) -> None:
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling = sampling
        self.block_size = block_size
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache at the first lookup (for metrics).
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.num_preemptions = 0
        self.arrival_ns = arrival_ns
        # False until the block manager has done the prefix lookup (again after preemption).
        self.looked_up = False
        # Constrained decoding (sampling.json_schema): fed every sampled token. It lives as
        # long as the sequence, so a preempted sequence resumes its grammar where it was.
        self.grammar = grammar

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_tokens(self, block_index: int) -> list[int]:
        start = block_index * self.block_size
        return self.token_ids[start:start + self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, status={self.status.name})")
