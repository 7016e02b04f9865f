"""The engine's only window to observability: cheap timestamps through an injected recorder.

The engine never imports OpenTelemetry or prometheus_client. It calls these methods with
`time.perf_counter_ns()` values at the stage boundaries it owns (docs/architecture.md,
"The nine server stages"); the server
injects an implementation that writes them into the tracer's per-request timeline.
Implementations must be cheap (a dict store): some calls run on the engine's step thread.
"""
from __future__ import annotations

from typing import Protocol


class StageRecorder(Protocol):
    def template_done(self, request_id: str, t_ns: int) -> None: ...

    def tokenize_done(self, request_id: str, t_ns: int, num_prompt_tokens: int) -> None: ...

    def kv_lookup_done(self, request_id: str, t_ns: int, num_hit_tokens: int,
                       num_hit_blocks: int, num_waiting: int = 0,
                       num_running: int = 0) -> None:
        """Admission: the prefix-cache hit, and the requests waiting and running when this
        one arrived."""

    def scheduled(self, request_id: str, t_ns: int) -> None:
        """Queue end: the first step that includes this request starts."""

    def prefill_chunk(self, request_id: str, start_ns: int, end_ns: int, num_tokens: int,
                      batch_size: int, num_batched_tokens: int, flops: int = 0,
                      step_flops: int = 0) -> None:
        """One forward pass that computed `num_tokens` prompt tokens of this request.
        `end_ns` is after the device finished it. `flops` is this request's share and
        `step_flops` the whole pass's, counted from the model shape
        (`instrumented_engine/model/flops.py`); 0 = not counted."""

    def first_token_sampled(self, request_id: str, t_ns: int) -> None: ...

    def first_text(self, request_id: str, t_ns: int, num_tokens: int) -> None:
        """The first printable text exists; it took `num_tokens` generated tokens."""

    def preempted(self, request_id: str, t_ns: int) -> None: ...

    def prompt_blocks(self, request_id: str, block_hashes: list[int], token_ids: list[int],
                      block_size: int) -> None:
        """The request is finishing: the prefix cache's chained hashes of its prompt's full
        blocks (read from the cache, none computed for this; empty without prefix caching),
        and its token ids by reference (the prompt first; no longer changing). For the
        trace export, which hashes them off this thread."""

    def step_done(self, kind: str, duration_ns: int, num_tokens: int) -> None:
        """A forward pass of `kind` (prefill, mixed, decode) took `duration_ns` for
        `num_tokens` (prefill tokens + decode sequences); once per step, for its metrics."""


class NoopRecorder:
    """The default: records nothing, costs one method call."""

    def template_done(self, request_id, t_ns): pass
    def tokenize_done(self, request_id, t_ns, num_prompt_tokens): pass
    def kv_lookup_done(self, request_id, t_ns, num_hit_tokens, num_hit_blocks,
                       num_waiting=0, num_running=0): pass
    def scheduled(self, request_id, t_ns): pass
    def prefill_chunk(self, request_id, start_ns, end_ns, num_tokens, batch_size,
                      num_batched_tokens, flops=0, step_flops=0): pass
    def first_token_sampled(self, request_id, t_ns): pass
    def first_text(self, request_id, t_ns, num_tokens): pass
    def preempted(self, request_id, t_ns): pass
    def prompt_blocks(self, request_id, block_hashes, token_ids, block_size): pass
    def step_done(self, kind, duration_ns, num_tokens): pass
