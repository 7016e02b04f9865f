"""What the diagnosis reads of one record (`Signals`) and of its surroundings (`Context`),
and what a judged record teaches its model's baseline (`observe`).

Apart from the rules (tracer/record/cause_rules.py) so that a rule reads a record through
these numbers alone, and so that the diagnoser and the collector's path verdict, which build
them once a record and feed the baseline with them, need nothing of the rules.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.record.baselines import ModelBaseline
from tracer.record.prompt_overlap import Overlap
from tracer.record.request_record import RequestRecord
from tracer.record.token_counts import REASONING_TOKENS_ATTR

# The stages before the engine's queue: the host's own work on the request.
PREPROCESS_STAGES = ("receive", "template", "tokenize", "kv_lookup")
# Where a proxy without its engine's timing sees the engine's prefill (with its queue).
_UPSTREAM_ENGINE_STAGES = ("upstream_ttfb", "upstream_first_token")
# Where the prefill is, by the same precedence as `Signals.prefill_ns`.
PREFILL_STAGES = ("prefill", "inference")


@dataclass(slots=True, frozen=True)
class Context:
    """What `judge` compares a record with, besides its model's baseline."""

    overlap: Overlap | None = None          # its prompt against recent ones
    requests_since_start: int = 0           # of this model, with a first token
    idle_s: float | None = None             # since the model's previous request ended

    @classmethod
    def of(cls, baseline: ModelBaseline, start_ns: int, overlap: Overlap | None = None) -> Context:
        """A record starting at `start_ns` against its model's baseline as it is now."""
        idle_s = None
        if baseline.last_end_ns is not None:
            idle_s = max(start_ns - baseline.last_end_ns, 0) / 1e9
        return cls(overlap=overlap, requests_since_start=baseline.num_requests, idle_s=idle_s)


@dataclass(slots=True)
class Signals:
    """The numbers of one record the rules read. Treat as read-only; not `frozen` because
    one is built for every record on the tracer's worker, where a frozen init's twelve
    `object.__setattr__` calls were a tenth of the diagnosis."""

    ttft_ns: int
    stage_ns: dict
    prompt_tokens: int
    cached_tokens: int
    prefill_ns: int | None        # our engine's or a joined engine's prefill; else upstream
    preprocess_ns: int | None
    num_waiting: int | None
    num_running: int | None
    num_preemptions: int          # before the first token
    tokens_before_text: int
    max_batch_size: int
    reasoning_tokens: int | None = None

    @property
    def uncached_tokens(self) -> int:
        return max(self.prompt_tokens - self.cached_tokens, 0)

    @classmethod
    def of(cls, record: RequestRecord) -> Signals:
        stages = record.stages
        stage_ns = {s.stage: s.end_ns - s.start_ns for s in stages}   # `duration_ns`, inline
        attrs = {s.stage: s.attrs for s in stages}
        prefill_ns = stage_ns.get("prefill", stage_ns.get("inference"))
        if prefill_ns is None and all(s in stage_ns for s in _UPSTREAM_ENGINE_STAGES):
            prefill_ns = sum(stage_ns[s] for s in _UPSTREAM_ENGINE_STAGES)
        pre = [stage_ns[s] for s in PREPROCESS_STAGES if s in stage_ns]
        kv = attrs.get("kv_lookup", {})
        ttft_end_ns = record.start_ns + (record.ttft_ns or 0)
        preemptions = max_batch = 0
        for name, t_ns, event_attrs in record.events:
            if name == "preempted" and t_ns <= ttft_end_ns:
                preemptions += 1
            elif name == "prefill_chunk":
                max_batch = max(max_batch, int(event_attrs.get("batch_size") or 0))
        return cls(
            ttft_ns=record.ttft_ns or 0, stage_ns=stage_ns,
            prompt_tokens=record.num_prompt_tokens, cached_tokens=record.num_cached_tokens,
            prefill_ns=prefill_ns, preprocess_ns=sum(pre) if pre else None,
            num_waiting=kv.get("num_waiting"), num_running=kv.get("num_running"),
            num_preemptions=preemptions,
            tokens_before_text=int(attrs.get("detokenize", {}).get("num_tokens") or 1),
            max_batch_size=max_batch,
            reasoning_tokens=record.attrs.get(REASONING_TOKENS_ATTR))


def observe(baseline: ModelBaseline, record: RequestRecord,
            signals: Signals | None = None) -> None:
    """Feed a finished record into its model's baseline (after judging it)."""
    if record.ttft_ns is None or record.error_type is not None:
        return
    s = Signals.of(record) if signals is None else signals
    baseline.add("ttft", s.ttft_ns)
    for stage, ns in s.stage_ns.items():
        baseline.add(stage, ns)
    if s.preprocess_ns is not None:
        baseline.add("preprocess", s.preprocess_ns)
    baseline.add("uncached_tokens", s.uncached_tokens)
    if s.prefill_ns is not None and s.uncached_tokens > 0:
        baseline.add_prefill(s.uncached_tokens, s.prefill_ns)
    kv_ns = s.stage_ns.get("kv_transfer")
    if kv_ns is not None and s.prompt_tokens > 0:
        baseline.add_per_token("kv_transfer", s.prompt_tokens, kv_ns)
    baseline.num_requests += 1
    baseline.last_end_ns = record.end_ns

