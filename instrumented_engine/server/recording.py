"""Bridges the engine's StageRecorder calls into the tracer's per-request timelines.

Runs partly on the engine's step thread, so every method is a dict lookup plus at most five
timeline writes (each GIL-atomic; `first_token_sampled` has the five); nothing here allocates
spans or touches metrics.
"""
from __future__ import annotations

from tracer.core.export_fields import EngineBlocks
from tracer.record.timeline import Timeline


class TimelineRecorder:
    """The engine's recorder: boundary timestamps → `Timeline.mark` by request id.

    >>> rec = TimelineRecorder(); tl = Timeline(0); rec.attach("r1", tl)
    >>> rec.template_done("r1", 10); tl.mark_ns("template")
    10
    """

    def __init__(self, on_step=None) -> None:
        # (kind, duration_ns, num_tokens) of each forward pass: the step metrics' observe.
        self._on_step = on_step
        self._timelines: dict[str, Timeline] = {}
        # End of the latest prefill chunk per request; the last one before the first token
        # becomes the prefill stage's end (a stage is marked once).
        self._prefill_end_ns: dict[str, int] = {}
        # Per request, over its prefill chunks: [its FLOPs, the passes' FLOPs, their ns].
        self._prefill_work: dict[str, list[int]] = {}
        # The prompt's blocks as the engine reported them at its finish, until `detach`
        # hands them to the record (the trace export's chain; tracer/core/export_fields.py).
        self._blocks: dict[str, EngineBlocks] = {}
        # Requests whose first output is not their first text (a streamed "required" tool
        # call starts when its name is complete): the server ends `detokenize` itself.
        self._first_output_by_server: set[str] = set()

    def attach(self, request_id: str, timeline: Timeline, *,
               server_ends_detokenize: bool = False) -> None:
        self._timelines[request_id] = timeline
        if server_ends_detokenize:
            self._first_output_by_server.add(request_id)

    def detach(self, request_id: str) -> EngineBlocks | None:
        """Forget the request; return what the engine reported of its prompt's blocks (None
        when the engine has not finished it yet, e.g. a client abort racing it)."""
        self._timelines.pop(request_id, None)
        self._prefill_end_ns.pop(request_id, None)
        self._prefill_work.pop(request_id, None)
        self._first_output_by_server.discard(request_id)
        return self._blocks.pop(request_id, None)

    def template_done(self, request_id: str, t_ns: int) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            tl.mark("template", t_ns)

    def tokenize_done(self, request_id: str, t_ns: int, num_prompt_tokens: int) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            tl.mark("tokenize", t_ns)
            tl.stage_attr("tokenize", "num_prompt_tokens", num_prompt_tokens)

    def kv_lookup_done(self, request_id: str, t_ns: int, num_hit_tokens: int,
                       num_hit_blocks: int, num_waiting: int = 0,
                       num_running: int = 0) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            tl.mark("kv_lookup", t_ns)
            tl.stage_attr("kv_lookup", "num_hit_tokens", num_hit_tokens)
            tl.stage_attr("kv_lookup", "num_hit_blocks", num_hit_blocks)
            tl.stage_attr("kv_lookup", "num_waiting", num_waiting)
            tl.stage_attr("kv_lookup", "num_running", num_running)

    def scheduled(self, request_id: str, t_ns: int) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            tl.mark("queue", t_ns)

    def prefill_chunk(self, request_id: str, start_ns: int, end_ns: int, num_tokens: int,
                      batch_size: int, num_batched_tokens: int, flops: int = 0,
                      step_flops: int = 0) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            self._prefill_end_ns[request_id] = end_ns
            tl.event("prefill_chunk", end_ns, start_ns=start_ns, num_tokens=num_tokens,
                     batch_size=batch_size, num_batched_tokens=num_batched_tokens,
                     flops=flops, step_flops=step_flops)
            work = self._prefill_work.setdefault(request_id, [0, 0, 0])
            work[0] += flops
            work[1] += step_flops
            work[2] += end_ns - start_ns

    def first_token_sampled(self, request_id: str, t_ns: int) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            prefill_end_ns = self._prefill_end_ns.get(request_id)
            if prefill_end_ns is not None:
                tl.mark("prefill", prefill_end_ns)
            tl.mark("sample", t_ns)
            work = self._prefill_work.pop(request_id, None)
            if work is not None and work[0]:
                # The span sink turns these into rates (docs/reference.md, "Spans").
                tl.stage_attr("prefill", "llm.prefill.flops", work[0])
                tl.stage_attr("prefill", "llm.prefill.step_flops", work[1])
                tl.stage_attr("prefill", "llm.prefill.forward_ns", work[2])

    def first_text(self, request_id: str, t_ns: int, num_tokens: int) -> None:
        if request_id in self._first_output_by_server:
            return
        if (tl := self._timelines.get(request_id)) is not None:
            tl.mark("detokenize", t_ns)
            tl.stage_attr("detokenize", "num_tokens", num_tokens)

    def preempted(self, request_id: str, t_ns: int) -> None:
        if (tl := self._timelines.get(request_id)) is not None:
            tl.event("preempted", t_ns)

    def prompt_blocks(self, request_id: str, block_hashes: list[int], token_ids: list[int],
                      block_size: int) -> None:
        if request_id in self._timelines:
            self._blocks[request_id] = EngineBlocks(block_hashes, token_ids, block_size)

    def step_done(self, kind: str, duration_ns: int, num_tokens: int) -> None:
        if self._on_step is not None:
            self._on_step(kind, duration_ns, num_tokens)
