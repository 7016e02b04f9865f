"""Continuous batching with chunked prefill and preemption by recompute (vLLM v1 style).

No phases: every step hands each chosen sequence some number of its uncomputed tokens.
Decodes (one token left) go first so they keep flowing while a long prompt is prefilled in
chunks; then prompts mid-prefill; then waiting sequences, first come first served. When a
running sequence cannot get a block, the latest arrival is preempted: its blocks are freed
and it goes back to the front of the queue, to be recomputed (mostly from the prefix cache).

Long prompts share the step (`long_prefill_token_threshold`, `max_num_partial_prefills`,
`max_long_partial_prefills`): a sequence with more uncomputed tokens than the threshold is
"long" and gets at most the threshold per step, so the rest of the budget admits prompts
waiting behind it. A step may leave at most `max_num_partial_prefills` sequences mid-prefill
(scheduled a chunk that does not finish their prompt), at most `max_long_partial_prefills` of
them long; a long prompt over that limit waits while shorter ones behind it are admitted.
Prompts finished within the step are not partial, so short prompts still batch freely.
Semantics and citations: docs/architecture.md, "Long prompts share the step".
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from instrumented_engine.engine.block_manager import BlockManager
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True, frozen=True)
class ScheduledSeq:
    """`num_new_tokens` tokens of `seq`, starting at `seq.num_computed_tokens`, in this step."""

    seq: Sequence
    num_new_tokens: int
    want_logits: bool  # the chunk reaches the last known token: sample from it


@dataclass(slots=True, frozen=True)
class SchedulerOutput:
    """One step's plan. `first_scheduled`: sequences in a batch for the first time ever."""

    scheduled: tuple[ScheduledSeq, ...]
    preempted: tuple[Sequence, ...]
    first_scheduled: tuple[Sequence, ...]
    num_batched_tokens: int


def _priority_key(seq: Sequence) -> tuple[int, int]:
    # Earlier arrival = higher priority; seq_id breaks ties in creation order.
    return seq.arrival_ns, seq.seq_id


class Scheduler:
    """Decides, each step, which tokens of which sequences the model computes.

    >>> from instrumented_engine.engine.sampling import SamplingParams
    >>> config = EngineConfig(block_size=4, num_kv_blocks=16, max_num_batched_tokens=8)
    >>> sched = Scheduler(config, BlockManager(16, 4))
    >>> seq = Sequence("r1", list(range(10)), SamplingParams(max_tokens=2), block_size=4)
    >>> sched.add(seq)
    0
    >>> out = sched.schedule(); [(s.num_new_tokens, s.want_logits) for s in out.scheduled]
    [(8, False)]
    >>> sched.on_step_done(out); sched.schedule().scheduled[0].num_new_tokens
    2
    """

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept in priority order
        self._by_request_id: dict[str, Sequence] = {}
        self._ever_scheduled: set[int] = set()  # seq_ids, until they finish

    # -- admission ------------------------------------------------------------------------

    def add(self, seq: Sequence) -> int:
        """Do the prefix lookup (reserving hit blocks) and queue `seq`; return hit tokens."""
        if seq.request_id in self._by_request_id:
            raise ValueError(f"request id {seq.request_id!r} is already scheduled")
        if seq.num_tokens == 0:
            raise ValueError(f"request {seq.request_id!r} has an empty prompt")
        # The last sampled token is never fed back, so it never needs a KV slot.
        num_max_tokens = seq.num_prompt_tokens + seq.sampling.max_tokens - 1
        num_max_blocks = seq.num_blocks_for(num_max_tokens)
        if num_max_blocks > self.block_manager.num_blocks:
            raise ValueError(
                f"request {seq.request_id!r} can need {num_max_blocks} KV blocks "
                f"({seq.num_prompt_tokens} prompt + {seq.sampling.max_tokens} max tokens, "
                f"{seq.block_size} tokens per block) but the cache has only "
                f"{self.block_manager.num_blocks} blocks")
        num_hit_tokens = self.block_manager.lookup(seq)
        seq.num_cached_tokens = num_hit_tokens
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._by_request_id[seq.request_id] = seq
        return num_hit_tokens

    # -- one step -------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        plan = _Plan(self.config.max_num_batched_tokens)
        decoding = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefilling = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decoding + prefilling:
            if plan.budget == 0:
                break
            if seq.status is SequenceStatus.RUNNING:  # not preempted earlier in this step
                self._schedule_running(seq, plan)
        # Like vLLM v1: a step that had to preempt is under block pressure; admitting now
        # would only take blocks the preempted ones need first.
        if not plan.preempted:
            self._admit_waiting(plan)
        scheduled = tuple(plan.scheduled.values())
        first = tuple(s.seq for s in scheduled if s.seq.seq_id not in self._ever_scheduled)
        self._ever_scheduled.update(s.seq_id for s in first)
        return SchedulerOutput(scheduled, tuple(plan.preempted), first,
                               sum(s.num_new_tokens for s in scheduled))

    def _is_long(self, seq: Sequence) -> bool:
        threshold = self.config.long_prefill_token_threshold
        return 0 < threshold < seq.num_uncomputed_tokens

    def _chunk_size(self, seq: Sequence, plan: _Plan) -> int:
        """Its uncomputed tokens, at most the threshold if it is long, at most the budget."""
        num_tokens = seq.num_uncomputed_tokens
        if self._is_long(seq):
            num_tokens = self.config.long_prefill_token_threshold
        return min(num_tokens, plan.budget)

    def _schedule_running(self, seq: Sequence, plan: _Plan) -> None:
        num_new_tokens = self._chunk_size(seq, plan)
        while not self.block_manager.allocate_slots(seq, num_new_tokens):
            victim = max(self.running, key=_priority_key)
            self._preempt(victim, plan)
            if victim is seq:
                return
        plan.add(seq, num_new_tokens)

    def _preempt(self, seq: Sequence, plan: _Plan) -> None:
        plan.remove(seq)
        self.running.remove(seq)
        self._unreserve(seq)
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)

    def _admit_waiting(self, plan: _Plan) -> None:
        passed_over: list[Sequence] = []  # long prompts over the limit, in queue order
        while self.waiting and plan.budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            relooked = not seq.looked_up
            if relooked:  # preempted (or released): its lookup is redone only now
                self.block_manager.lookup(seq)
            num_new_tokens = self._chunk_size(seq, plan)
            over_limit = self._over_partial_limit(seq, num_new_tokens, plan)
            if over_limit or not self._allocate_for_head(seq, num_new_tokens):
                if relooked:  # don't pin blocks for a sequence that cannot start yet
                    self._unreserve(seq)
                if over_limit and self._is_long(seq):  # shorter ones behind may start
                    passed_over.append(self.waiting.popleft())
                    continue
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.running.sort(key=_priority_key)
            plan.add(seq, num_new_tokens)
        self.waiting.extendleft(reversed(passed_over))

    def _over_partial_limit(self, seq: Sequence, num_new_tokens: int, plan: _Plan) -> bool:
        """Would starting `seq` with this chunk leave too many sequences mid-prefill?"""
        if num_new_tokens == seq.num_uncomputed_tokens:  # its prompt ends in this step
            return False
        num_partial, num_long = self._partial_prefills(plan)
        return (num_partial >= self.config.max_num_partial_prefills
                or (self._is_long(seq) and num_long >= self.config.max_long_partial_prefills))

    def _partial_prefills(self, plan: _Plan) -> tuple[int, int]:
        """(running sequences this step leaves mid-prefill, how many of them are long)."""
        num_partial = num_long = 0
        for seq in self.running:
            if seq.num_uncomputed_tokens <= 1:  # decoding
                continue
            item = plan.scheduled.get(seq.seq_id)
            if item is None or item.num_new_tokens < seq.num_uncomputed_tokens:
                num_partial += 1
                num_long += self._is_long(seq)
        return num_partial, num_long

    def _allocate_for_head(self, seq: Sequence, num_new_tokens: int) -> bool:
        if self.block_manager.allocate_slots(seq, num_new_tokens):
            return True
        # Hit blocks reserved at `add` by sequences behind the head could pin the cache
        # while nothing runs, and the head would wait forever: release them. They redo the
        # lookup when admitted (freed blocks keep their hashes, so it usually hits again).
        if self.running:
            return False
        released = [s for s in list(self.waiting)[:0:-1] if s.block_table]
        for later in released:
            self._unreserve(later)
        return bool(released) and self.block_manager.allocate_slots(seq, num_new_tokens)

    def _unreserve(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.looked_up = False

    def on_step_done(self, out: SchedulerOutput) -> None:
        """Account for a finished forward pass: advance and cache what it computed.

        Call it before finishing sequences of this step, so their blocks are cached first.
        """
        for item in out.scheduled:
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:  # aborted while the step ran
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.commit(seq)

    # -- leaving --------------------------------------------------------------------------

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Mark `seq` finished with `status`, drop it from the queues, free its blocks."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = status
        self.block_manager.free(seq)
        self._by_request_id.pop(seq.request_id, None)
        self._ever_scheduled.discard(seq.seq_id)

    def abort(self, request_id: str) -> Sequence | None:
        """Finish the request as aborted and free its blocks now; None if unknown."""
        seq = self._by_request_id.get(request_id)
        if seq is not None:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seq

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def kv_usage_ratio(self) -> float:
        return self.block_manager.usage_ratio


class _Plan:
    """The step being built: scheduled chunks by seq_id, preemptions, remaining budget."""

    __slots__ = ("budget", "scheduled", "preempted")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.scheduled: dict[int, ScheduledSeq] = {}
        self.preempted: list[Sequence] = []

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        want_logits = seq.num_computed_tokens + num_new_tokens == seq.num_tokens
        self.scheduled[seq.seq_id] = ScheduledSeq(seq, num_new_tokens, want_logits)
        self.budget -= num_new_tokens

    def remove(self, seq: Sequence) -> None:
        # A victim already planned this step gives its tokens back to the budget.
        item = self.scheduled.pop(seq.seq_id, None)
        if item is not None:
            self.budget += item.num_new_tokens
