"""What a response's output began with, and its tool calls (docs/reference.md, "Metrics";
docs/architecture.md, "First output, by kind").

`gen_ai_server_time_to_first_token_seconds` stays the time to the first text: the TTFT alert,
the stage sum, the probe's client TTFT and the network overhead subtracted from it all mean
the wait before words. vLLM's TTFT and the GenAI convention count the first generated token
of any kind, and an agent's turn may have no text at all; so the first output of every
answer is observed here, with its kind, and no answer leaves every histogram unobserved:
`sum by (le)` over `kind` is the engines' TTFT.

>>> from prometheus_client import CollectorRegistry
>>> OutputMetrics(CollectorRegistry(), ("smollm2", "other")).kinds
('text', 'reasoning', 'tool_call')
"""
from __future__ import annotations

import time

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from tracer.record.buckets import TTFT_BUCKETS_S
from tracer.record.request_record import RequestRecord
from tracer.record.stages import OUTPUT_KINDS
from tracer.sinks.gap_histogram import WRITE_NOW


class OutputMetrics:
    """`llm_time_to_first_output_seconds{model, kind}` and `llm_tool_calls_total{model}`, every
    child bound up front for the closed models and kinds."""

    def __init__(self, registry: CollectorRegistry, models: Sequence[str]) -> None:
        self.kinds = OUTPUT_KINDS
        first = Histogram("llm_time_to_first_output_seconds", "Server time to the first output "
                          "of any kind: text, reasoning or a tool call (the stages' end)",
                          ("model", "kind"), registry=registry, buckets=TTFT_BUCKETS_S)
        calls = Counter("llm_tool_calls", "Tool calls the answers made (each call once, from "
                        "its first delta naming the function)", ("model",), registry=registry)
        self._first = {(m, k): first.labels(m, k) for m in models for k in OUTPUT_KINDS}
        self._calls = {m: calls.labels(m) for m in models}

    def observe(self, model: str, record: RequestRecord, exemplar: dict | None,
                now: float | None = None, writes=WRITE_NOW) -> None:
        """`model`: the record's closed model label. Through `writes`: the record's other
        observations' batch (tracer/sinks/observation_batch.py), else at once."""
        now = time.time() if now is None else now
        if record.first_output_ns is not None:
            child = self._first.get((model, record.first_output_kind))
            if child is not None:
                # The record's path: the same writes as `child.observe`, the exemplar stamped
                # when the record is.
                writes.observe(child, record.first_output_ns * 1e-9, exemplar, now)
        if record.num_tool_calls:   # a count of the record's (>= 0): the value's own `inc`
            writes.inc(self._calls[model]._value, record.num_tool_calls)
