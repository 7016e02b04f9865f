"""Scheduler: chunked prefill beside decodes, FCFS, preemption, aborts, queue-end reporting.

A fake model drives it the way the engine does (schedule → write KV → on_step_done →
append a token where logits were wanted → finish), and simulates the paged KV cache
itself: every slot a step writes holds that token, and every computed position a step
reads must hold the right token, so a wrong block table or a bad prefix hit fails loudly.
"""
from __future__ import annotations

import pytest
from hypothesis import event, given, settings, strategies as st

from instrumented_engine.engine.block_manager import BlockManager
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.scheduler import Scheduler, SchedulerOutput
from instrumented_engine.engine.sequence import Sequence, SequenceStatus


def next_token(token_ids: list[int]) -> int:
    # Like a real model, a function of the context: equal prefixes give equal outputs.
    return (31 * token_ids[-1] + len(token_ids)) % 1000


def expected_output(prompt_ids: list[int], max_tokens: int) -> list[int]:
    token_ids = list(prompt_ids)
    for _ in range(max_tokens):
        token_ids.append(next_token(token_ids))
    return token_ids[len(prompt_ids):]


class FakeEngine:
    """Steps a Scheduler like the engine and checks every step's invariants."""

    def __init__(self, block_size: int = 4, num_kv_blocks: int = 64, budget: int = 32,
                 max_num_seqs: int = 8, prefix_caching: bool = True) -> None:
        self.config = EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                                   max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                   enable_prefix_caching=prefix_caching)
        self.bm = BlockManager(num_kv_blocks, block_size, prefix_caching)
        self.sched = Scheduler(self.config, self.bm)
        self.kv: dict[tuple[int, int], int] = {}  # (block id, slot) -> token id
        self.outputs: list[SchedulerOutput] = []
        self.num_steps = 0
        self._num_added = 0

    def add(self, name: str, prompt_ids: list[int], max_tokens: int,
            arrival_ns: int | None = None) -> Sequence:
        self._num_added += 1
        seq = Sequence(name, prompt_ids, SamplingParams(max_tokens=max_tokens),
                       self.config.block_size,
                       arrival_ns=self._num_added if arrival_ns is None else arrival_ns)
        self.sched.add(seq)
        return seq

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.num_steps += 1
        self.outputs.append(out)
        self._check_plan(out)
        for item in out.scheduled:
            self._run_kv(item.seq, item.num_new_tokens)
        self.sched.on_step_done(out)
        for item in out.scheduled:
            seq = item.seq
            if item.want_logits:
                assert seq.num_computed_tokens == seq.num_tokens
                seq.append_token(next_token(seq.token_ids))
                if seq.num_output_tokens >= seq.sampling.max_tokens:
                    self.sched.finish(seq, SequenceStatus.FINISHED_LENGTH)
            else:
                assert seq.num_computed_tokens < seq.num_tokens
        return out

    def run_until_done(self, max_steps: int = 2_000) -> None:
        while self.sched.has_unfinished:
            assert self.num_steps < max_steps, "no progress: the scheduler is stuck"
            self.step()

    def _check_plan(self, out: SchedulerOutput) -> None:
        ids = [item.seq.seq_id for item in out.scheduled]
        assert len(ids) == len(set(ids))
        assert out.num_batched_tokens == sum(i.num_new_tokens for i in out.scheduled)
        assert out.num_batched_tokens <= self.config.max_num_batched_tokens
        assert self.sched.num_running <= self.config.max_num_seqs
        assert not {s.seq_id for s in out.preempted} & set(ids)
        for seq in out.preempted:
            assert seq.status is SequenceStatus.WAITING and seq.block_table == []
            assert seq.num_computed_tokens == 0
        for item in out.scheduled:
            seq, n = item.seq, item.num_new_tokens
            assert seq.status is SequenceStatus.RUNNING and 1 <= n <= seq.num_uncomputed_tokens
            assert item.want_logits == (seq.num_computed_tokens + n == seq.num_tokens)
            assert len(seq.block_table) == seq.num_blocks_for(seq.num_computed_tokens + n)

    def _run_kv(self, seq: Sequence, num_new_tokens: int) -> None:
        bs, table = self.config.block_size, seq.block_table
        for pos in range(seq.num_computed_tokens):  # attention reads the whole prefix
            assert self.kv.get((table[pos // bs], pos % bs)) == seq.token_ids[pos], (seq, pos)
        for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens):
            block_id = table[pos // bs]
            assert self.bm.block(block_id).ref_count == 1, "writing into a shared block"
            self.kv[(block_id, pos % bs)] = seq.token_ids[pos]


def decoding_trio(engine: FakeEngine) -> list[Sequence]:
    trio = [engine.add(f"d{i}", [i + 1] * 5, max_tokens=50) for i in range(3)]
    engine.step()  # all three prefill at once and sample their first token
    assert all(s.num_uncomputed_tokens == 1 for s in trio)
    return trio


@pytest.mark.parametrize(("budget", "chunks"), [(259, [256, 256, 256, 232]),
                                                (256, [253, 253, 253, 241])])
def test_long_prompt_is_chunked_while_decodes_progress(budget, chunks):
    engine = FakeEngine(block_size=16, num_kv_blocks=128, budget=budget)
    trio = decoding_trio(engine)
    long = engine.add("long", [7] * 1000, max_tokens=4)
    for step, chunk in enumerate(chunks):
        out = engine.step()
        assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == \
            [("d0", 1), ("d1", 1), ("d2", 1), ("long", chunk)]
        assert out.num_batched_tokens == budget or step == len(chunks) - 1
        assert out.scheduled[-1].want_logits == (step == len(chunks) - 1)
    assert long.num_output_tokens == 1 and long.num_computed_tokens == 1000
    assert [s.num_output_tokens for s in trio] == [1 + len(chunks)] * 3


def test_waiting_sequences_are_admitted_first_come_first_served():
    engine = FakeEngine(budget=8)
    a, b, c = (engine.add(name, [n] * 6, max_tokens=2) for n, name in enumerate("abc"))
    out = engine.step()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("a", 6), ("b", 2)]
    assert [s.request_id for s in out.first_scheduled] == ["a", "b"]
    out = engine.step()  # a decodes, b continues its prefill, c gets what is left
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == \
        [("a", 1), ("b", 4), ("c", 3)]
    engine.run_until_done()
    assert all(s.output_token_ids == expected_output([n] * 6, 2) for n, s in enumerate((a, b, c)))


def test_max_num_seqs_caps_the_running_set():
    engine = FakeEngine(budget=64, max_num_seqs=2)
    seqs = [engine.add(f"s{i}", [i] * 3, max_tokens=3) for i in range(4)]
    out = engine.step()
    assert [i.seq.request_id for i in out.scheduled] == ["s0", "s1"]
    assert engine.sched.num_waiting == 2
    engine.run_until_done()
    starts = [next(k for k, o in enumerate(engine.outputs) if s in o.first_scheduled)
              for s in seqs]
    assert starts == sorted(starts) and starts[2] > 0


def test_decode_that_needs_a_block_preempts_the_latest_arrival():
    engine = FakeEngine(block_size=4, num_kv_blocks=4, budget=32)
    a, b = engine.add("a", [1] * 7, max_tokens=10), engine.add("b", [2] * 7, max_tokens=10)
    engine.step()
    engine.step()
    assert a.num_tokens == b.num_tokens == 9 and engine.bm.num_free_blocks == 0
    c = engine.add("c", [3] * 3, max_tokens=2)  # no room: waits
    out = engine.step()  # a's 9th token needs a third block
    assert [i.seq for i in out.scheduled] == [a] and out.preempted == (b,)
    assert b.num_preemptions == 1 and list(engine.sched.waiting) == [b, c]
    out = engine.step()  # b can't restart yet, and must not pin blocks while it waits
    assert [i.seq for i in out.scheduled] == [a] and b.block_table == []
    engine.run_until_done()
    assert c.output_token_ids == expected_output([3] * 3, 2)
    assert a.output_token_ids == expected_output([1] * 7, 10)
    assert b.output_token_ids == expected_output([2] * 7, 10)
    assert engine.bm.num_used_blocks == 0


def test_the_latest_arrival_preempts_itself():
    engine = FakeEngine(block_size=4, num_kv_blocks=4, budget=32)
    a, b = engine.add("a", [1] * 5, max_tokens=8), engine.add("b", [2] * 7, max_tokens=8)
    engine.step()
    engine.step()
    out = engine.step()  # b needs a third block; a fits; b is the lowest priority
    assert [i.seq for i in out.scheduled] == [a] and out.preempted == (b,)
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    engine.run_until_done()
    assert b.output_token_ids == expected_output([2] * 7, 8)


def test_preempting_an_already_planned_victim_refunds_its_tokens():
    engine = FakeEngine(block_size=4, num_kv_blocks=5, budget=9)
    # b is queued first but arrived later (higher arrival_ns): a outranks it.
    b = engine.add("b", [2] * 3, max_tokens=6, arrival_ns=2)
    engine.step()
    a = engine.add("a", [1] * 20, max_tokens=1, arrival_ns=1)
    out = engine.step()
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(b, 1), (a, 8)]
    assert engine.sched.running == [a, b]  # priority order, not admission order
    out = engine.step()  # b's decode is planned first, then a's chunk evicts it
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(a, 8)]
    assert out.preempted == (b,) and out.num_batched_tokens == 8
    engine.run_until_done()
    assert b.output_token_ids == expected_output([2] * 3, 6)


def test_block_pressure_preempts_yet_everyone_finishes_correctly():
    engine = FakeEngine(block_size=4, num_kv_blocks=10, budget=32)
    prompts = {f"r{i}": [10 * i + k for k in range(10)] for i in range(6)}
    seqs = [engine.add(name, ids, max_tokens=14) for name, ids in prompts.items()]
    engine.run_until_done()
    assert sum(s.num_preemptions for s in seqs) > 0
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED_LENGTH
        assert seq.output_token_ids == expected_output(prompts[seq.request_id], 14)
    assert engine.bm.num_used_blocks == 0 and engine.sched.num_running == 0
    firsts = [s.request_id for out in engine.outputs for s in out.first_scheduled]
    assert sorted(firsts) == sorted(prompts)  # exactly once each, preemptions or not


def test_prefix_hit_at_add_skips_the_cached_tokens():
    engine = FakeEngine(block_size=4, budget=64)
    system = list(range(100, 112))
    engine.add("first", system + [1, 2], max_tokens=2)
    engine.run_until_done()
    seq = engine.add("second", system + [3, 4, 5], max_tokens=2)
    assert seq.num_cached_tokens == 12 and seq.num_computed_tokens == 12
    out = engine.step()
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(seq, 3)]
    engine.run_until_done()
    assert seq.num_cached_tokens == 12  # set by the first lookup only


def test_abort_frees_blocks_at_once_for_running_and_waiting():
    engine = FakeEngine(block_size=4, budget=8, max_num_seqs=1)
    engine.add("cached", list(range(9)), max_tokens=1)
    engine.run_until_done()
    running = engine.add("running", [50] * 12, max_tokens=4)
    waiting = engine.add("waiting", list(range(8)) + [77], max_tokens=4)  # holds 2 hit blocks
    engine.step()
    assert running.status is SequenceStatus.RUNNING and waiting.status is SequenceStatus.WAITING
    assert engine.bm.num_used_blocks == 2 + 2
    assert engine.sched.abort("waiting") is waiting
    assert waiting.status is SequenceStatus.FINISHED_ABORTED and waiting.block_table == []
    assert engine.bm.num_used_blocks == 2 and engine.sched.num_waiting == 0
    assert engine.sched.abort("running") is running
    assert engine.bm.num_used_blocks == 0 and not engine.sched.has_unfinished
    assert engine.sched.abort("running") is None and engine.sched.abort("nope") is None
    assert engine.sched.schedule().scheduled == ()


def test_abort_while_the_step_runs_is_not_advanced():
    engine = FakeEngine()
    seq = engine.add("r", [1] * 6, max_tokens=4)
    out = engine.sched.schedule()
    engine.sched.abort("r")
    engine.sched.on_step_done(out)
    assert seq.num_computed_tokens == 0 and engine.bm.num_used_blocks == 0


def test_reserved_hit_blocks_of_later_requests_do_not_block_the_head():
    engine = FakeEngine(block_size=4, num_kv_blocks=4, budget=32)
    engine.add("cached", list(range(13)), max_tokens=1)
    engine.run_until_done()
    head = engine.add("head", [500] * 13, max_tokens=1)  # needs all 4 blocks
    later = engine.add("later", list(range(13)), max_tokens=2)  # reserves 3 hit blocks
    assert later.num_cached_tokens == 12 and engine.bm.num_used_blocks == 3
    engine.run_until_done(max_steps=engine.num_steps + 20)
    assert head.output_token_ids == expected_output([500] * 13, 1)
    assert later.output_token_ids == expected_output(list(range(13)), 2)


def test_a_request_that_can_never_fit_is_refused_at_add():
    engine = FakeEngine(block_size=4, num_kv_blocks=4)
    with pytest.raises(ValueError, match=r"5 KV blocks .*17 prompt \+ 1 max tokens.*only 4"):
        engine.add("big", [1] * 17, max_tokens=1)
    engine.add("fits", [1] * 15, max_tokens=2)  # 16 KV slots: the last token needs none
    assert engine.sched.num_waiting == 1 and engine.bm.num_used_blocks == 0


SHARED_PREFIX = [(7 * k) % 11 for k in range(24)]  # a "system prompt" many requests share

workloads = st.lists(
    st.tuples(st.integers(0, 24),                                   # shared prefix length
              st.lists(st.integers(0, 3), min_size=1, max_size=8),  # own suffix
              st.integers(1, 8),                                    # max_tokens
              st.integers(0, 10),                                   # added at this step
              st.integers(0, 30)),                                  # aborted at (0 = never)
    min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(workloads, st.sampled_from([2, 4]), st.integers(1, 40), st.integers(1, 4),
       st.booleans())
def test_random_workloads_finish_with_no_blocks_left(workload, block_size, budget,
                                                     max_num_seqs, prefix_caching):
    prompts = [SHARED_PREFIX[:k] + suffix for k, suffix, *_ in workload]
    # Just enough blocks for the largest request: heavy pressure, yet everything fits.
    num_kv_blocks = max(-(-(len(ids) + n - 1) // block_size)
                        for ids, (_, _, n, _, _) in zip(prompts, workload))
    engine = FakeEngine(block_size, num_kv_blocks, budget, max_num_seqs, prefix_caching)
    seqs: dict[int, Sequence] = {}
    while len(seqs) < len(workload) or engine.sched.has_unfinished:
        assert engine.num_steps < 2_000
        for i, (_, _, max_tokens, add_at, abort_at) in enumerate(workload):
            if add_at == engine.num_steps:
                seqs[i] = engine.add(f"r{i}", prompts[i], max_tokens)
            if abort_at and abort_at == engine.num_steps and i in seqs:
                engine.sched.abort(f"r{i}")
        engine.step()
    assert engine.bm.num_used_blocks == 0
    event(f"preempted: {any(s.num_preemptions for s in seqs.values())}")
    event(f"prefix hit: {any(s.num_cached_tokens for s in seqs.values())}")
    for i, seq in seqs.items():
        assert seq.is_finished
        if seq.status is SequenceStatus.FINISHED_LENGTH:
            assert seq.output_token_ids == expected_output(prompts[i], workload[i][2])
