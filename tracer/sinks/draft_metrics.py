"""Speculative decoding, per model: the tokens the draft proposed and those the target
accepted (docs/reference.md, "Metrics"; the counts come from the engine, e.g. llama.cpp's
`timings.draft_n` / `draft_n_accepted`, tracer/engines/llamacpp.py).

Two counters, not a histogram of per-request rates: their ratio over any window,
`rate(accepted) / rate(drafted)`, weighs each request by what it drafted, which is the
acceptance the decode speed follows; a mean of per-request rates would weigh a two-token
answer like a two-thousand-token one.

>>> from prometheus_client import CollectorRegistry
>>> from tracer.record.request_record import RequestRecord
>>> m = DraftMetrics(CollectorRegistry(), ("smollm2", "other"))
>>> m.observe("smollm2", RequestRecord("r", "0" * 32, "0" * 16, "smollm2", "chat", 0, 1,
...                                    num_draft_tokens=8, num_draft_accepted=6))
>>> m.registry.get_sample_value("llm_draft_accepted_tokens_total", {"model": "smollm2"})
6.0
"""
from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter

from tracer.record.request_record import RequestRecord
from tracer.sinks.gap_histogram import WRITE_NOW


class DraftMetrics:
    """`llm_draft_tokens_total{model}` and `llm_draft_accepted_tokens_total{model}`, every
    child bound up front for the closed models."""

    def __init__(self, registry: CollectorRegistry, models: Sequence[str]) -> None:
        self.registry = registry
        drafted = Counter("llm_draft_tokens", "Tokens a speculative-decoding draft proposed, "
                          "as the engine reported them", ("model",), registry=registry)
        accepted = Counter("llm_draft_accepted_tokens", "Draft tokens the target model "
                           "accepted, as the engine reported them", ("model",), registry=registry)
        self._drafted = {m: drafted.labels(m) for m in models}
        self._accepted = {m: accepted.labels(m) for m in models}

    def observe(self, model: str, record: RequestRecord, writes=WRITE_NOW) -> None:
        """`model`: the record's closed model label. Nothing drafted, nothing counted.
        Through `writes`: a batch (tracer/sinks/observation_batch.py), else at once."""
        if record.num_draft_tokens and model in self._drafted:
            # Counts the record checked (>= 0): the values' own `inc`.
            writes.inc(self._drafted[model]._value, record.num_draft_tokens)
            writes.inc(self._accepted[model]._value, record.num_draft_accepted)
