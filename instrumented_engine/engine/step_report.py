"""What one forward pass reports once it ran: each first prefill's chunk to the recorder (a
TTFT stage, with its FLOPs), and the step itself to the step log and the recorder.

Both run before `Scheduler.on_step_done`: each sequence's `num_computed_tokens` is still its
chunk's start position, which the FLOP count and `step_of` read.
"""
from __future__ import annotations

from collections.abc import Iterable

from instrumented_engine.engine.recorder import StageRecorder
from instrumented_engine.engine.scheduler import ScheduledSeq, SchedulerOutput
from instrumented_engine.engine.step_log import StepLog, step_of
from instrumented_engine.model.flops import FlopCounter


def report_prefill_chunks(recorder: StageRecorder, flops: FlopCounter, plan: SchedulerOutput,
                          live: Iterable[ScheduledSeq], start_ns: int, end_ns: int) -> None:
    # Only the prefill that leads to the first token is a TTFT stage; a recompute after
    # preemption later on is decode-time cost and is recorded as a `preempted` event.
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


def report_step(recorder: StageRecorder, steps: StepLog, plan: SchedulerOutput, start_ns: int,
                end_ns: int) -> None:
    step = step_of(plan.scheduled, len(plan.preempted), start_ns, end_ns)
    steps.append(step)
    recorder.step_done(step.kind, end_ns - start_ns, step.num_batched_tokens)
