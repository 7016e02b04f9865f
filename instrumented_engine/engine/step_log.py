"""The engine's step record: what each forward pass computed, for whom, in a bounded ring.

A request's own timeline says how long it queued and prefilled; only the steps say behind
whom. Each step keeps its start and end, its prefill tokens and decode sequences, the
request ids in it with their token counts, and how many sequences it preempted
(docs/architecture.md, "Neighbours"). The ring holds the last `capacity` steps
(`--step-log-size`); an older step is overwritten, never grown into.

One writer (the engine's step thread) appends a finished tuple; readers (the tracer's worker,
`/ui`) copy the ring with `list(deque)`, a C loop the GIL keeps atomic, so neither side locks.
The append is the whole cost on the hot loop: a tuple, two small tuples of the step's ids and
counts, and a deque append (bench/engine_bench.py --step-log measures it).
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

# About two minutes of decode steps at 16 streams on a 2-core CPU, ~1 KiB each at 16 ids.
DEFAULT_STEP_LOG_SIZE = 8192


class EngineStep(NamedTuple):
    """One forward pass. `request_ids[:num_decode_seqs]` decoded one token each; the rest
    computed `num_tokens[i]` prompt tokens (a first prefill, or a recompute after a
    preemption). Times are the engine clock's (perf_counter_ns)."""

    start_ns: int
    end_ns: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_preempted: int
    request_ids: tuple[str, ...]
    num_tokens: tuple[int, ...]

    @property
    def kind(self) -> str:
        """prefill, mixed or decode: the label vocabulary of the step metrics
        (tracer/record/stages.py, `STEP_KINDS`)."""
        if not self.num_decode_seqs:
            return "prefill"
        return "mixed" if self.num_prefill_tokens else "decode"

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs


def step_of(scheduled, num_preempted: int, start_ns: int, end_ns: int) -> EngineStep:
    """The step record of a planned step (`ScheduledSeq`s), read before the step's tokens
    are counted as computed: a decode is a sequence with output whose chunk is its one
    uncomputed token; anything else computed prompt tokens (a prefill or a recompute)."""
    decode_ids, prefill_ids, prefill_tokens = [], [], []
    for s in scheduled:
        seq = s.seq
        if seq.num_output_tokens and s.num_new_tokens == 1 \
                and seq.num_computed_tokens + 1 == seq.num_tokens:
            decode_ids.append(seq.request_id)
        else:
            prefill_ids.append(seq.request_id)
            prefill_tokens.append(s.num_new_tokens)
    num_decode = len(decode_ids)
    return EngineStep(start_ns, end_ns, sum(prefill_tokens), num_decode, num_preempted,
                      tuple(decode_ids + prefill_ids), (1,) * num_decode + tuple(prefill_tokens))


class StepLog:
    """The last `capacity` steps, oldest first.

    >>> log = StepLog(2)
    >>> for i in range(3):
    ...     log.append(EngineStep(i * 10, i * 10 + 5, 0, 1, 0, (f"r{i}",), (1,)))
    >>> [s.request_ids for s in log.between(0, 100)], log.num_steps
    ([('r1',), ('r2',)], 3)
    """

    __slots__ = ("capacity", "_steps", "num_steps")

    def __init__(self, capacity: int = DEFAULT_STEP_LOG_SIZE) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._steps: deque[EngineStep] = deque(maxlen=capacity)
        self.num_steps = 0      # ever appended: num_steps - len(ring) were overwritten

    def append(self, step: EngineStep) -> None:
        self._steps.append(step)
        self.num_steps += 1

    def between(self, from_ns: int, to_ns: int) -> list[EngineStep]:
        """The kept steps overlapping [from_ns, to_ns], oldest first."""
        steps = list(self._steps)       # atomic copy: the step thread keeps appending
        out = []
        for step in reversed(steps):
            if step.end_ns < from_ns:
                break                   # steps do not overlap: every older one ended before
            if step.start_ns <= to_ns:
                out.append(step)
        out.reverse()
        return out

    def __len__(self) -> int:
        return len(self._steps)
