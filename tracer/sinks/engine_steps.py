"""The engine's forward passes as metrics: `llm_engine_step_seconds` and
`llm_engine_step_tokens` by step kind (prefill, mixed, decode), like vLLM's
`vllm:iteration_tokens_total` (docs/reference.md, "Metrics").

`observe` runs on the engine's step thread once per step (~1-2 µs: a dict lookup and two
`observe` calls on children resolved here, at construction), so nothing on that loop formats
labels. The kinds are the closed list `STEP_KINDS`; anything else is dropped, not labelled.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from tracer.record.buckets import STEP_BUCKETS_S, STEP_TOKEN_BUCKETS
from tracer.record.stages import STEP_KINDS


class EngineStepMetrics:
    """Histograms of step time and tokens per step.

    >>> from prometheus_client import CollectorRegistry
    >>> registry = CollectorRegistry()
    >>> steps = EngineStepMetrics(registry, "smollm2")
    >>> steps.observe("decode", 20_000_000, 16)
    >>> registry.get_sample_value("llm_engine_step_tokens_sum",
    ...                           {"model": "smollm2", "kind": "decode"})
    16.0
    """

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        seconds = Histogram("llm_engine_step_seconds", "Time of one engine forward pass, by "
                            "step kind", ("model", "kind"), registry=registry,
                            buckets=STEP_BUCKETS_S)
        tokens = Histogram("llm_engine_step_tokens", "Tokens computed in one engine forward "
                           "pass (prefill tokens + decode sequences), by step kind",
                           ("model", "kind"), registry=registry, buckets=STEP_TOKEN_BUCKETS)
        self._children = {kind: (seconds.labels(model, kind), tokens.labels(model, kind))
                          for kind in STEP_KINDS}

    def observe(self, kind: str, duration_ns: int, num_tokens: int) -> None:
        children = self._children.get(kind)
        if children is not None:
            children[0].observe(duration_ns / 1e9)
            children[1].observe(num_tokens)
