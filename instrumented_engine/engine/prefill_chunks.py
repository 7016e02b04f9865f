"""A forward pass's first-prefill chunks, reported to the recorder: a TTFT stage each, with
its tokens, its batch and its FLOPs (and the whole step's, to compare).

Only the prefill that leads to the first token is a TTFT stage; a recompute after preemption
later on is decode-time cost and is recorded as a `preempted` event. Runs before
`Scheduler.on_step_done`: each sequence's `num_computed_tokens` is still its chunk's start
position, which the FLOP count reads.
"""
from __future__ import annotations

from collections.abc import Iterable

from instrumented_engine.engine.recorder import StageRecorder
from instrumented_engine.engine.scheduler import ScheduledSeq, SchedulerOutput
from instrumented_engine.model.flops import FlopCounter


def report_prefill_chunks(recorder: StageRecorder, flops: FlopCounter, plan: SchedulerOutput,
                          live: Iterable[ScheduledSeq], start_ns: int, end_ns: int) -> None:
    # FLOPs are counted only for steps that record a chunk.
    batch_size = len(plan.scheduled)
    step_flops = None
    count = flops.chunk
    for s in live:
        if s.seq.num_output_tokens == 0:
            if step_flops is None:
                step_flops = sum(count(t.num_new_tokens, t.seq.num_computed_tokens,
                                       int(t.want_logits)) for t in plan.scheduled)
            chunk_flops = count(s.num_new_tokens, s.seq.num_computed_tokens, int(s.want_logits))
            recorder.prefill_chunk(s.seq.request_id, start_ns, end_ns, s.num_new_tokens,
                                   batch_size, plan.num_batched_tokens, chunk_flops, step_flops)
