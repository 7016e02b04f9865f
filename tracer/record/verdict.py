"""One request's TTFT verdict: the cause, how much of the TTFT it explains, the evidence and
the change to make (docs/architecture.md, "Diagnosis").

`judge` is a pure function of the record and of what is normal for its model (a
`ModelBaseline`, `tracer.record.baselines`), the best overlap of its prompt with a recent
one (`tracer.record.prompt_overlap`) and how long the model had been idle. Each rule of
`tracer.record.causes` that fires yields a `Finding` with its excess over normal; the
verdict's cause is the finding with the largest excess (the vocabulary's order breaks a
tie); when none fires, `healthy` if every rule that applies could judge, else `unjudged`
(a rule had too little history: no history, no "healthy"). A finding fires only when its excess is at least
`floor_ns`: `MIN_EXCESS_MS`, or `EXCESS_SHARE` of the model's normal TTFT if that is more.
Prefill is never blamed for being large: only for being larger than prompts of its length
usually take.

`judge_client` adds what the browser's beacon shows (network, buffering) once it joins;
`with_findings` what a rule outside `judge` found (the neighbours' blame, the whole path's
backend).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tracer.record.baselines import MIN_SAMPLES, ModelBaseline
from tracer.record.causes import (
    BEHIND_LONG_PREFILL_ACTIONS,
    BUFFERING,
    CAUSE_BY_NAME,
    CAUSE_NAMES,
    CLIENT_CAUSES,
    HEALTHY,
    NETWORK,
    QUEUEING,
    SLOW_PREFILL,
    UNJUDGED,
)
from tracer.record.cause_rules import (
    LONG_PROMPT_FACTOR,
    LONG_PROMPT_MIN_TOKENS,
    RULES,
    QUEUE_STAGES,
)
from tracer.record.diagnosis_signals import PREFILL_STAGES, Context, Signals
from tracer.record.neighbours import Neighbour, culprits
from tracer.record.request_record import RequestRecord
from tracer.record.rule_outcome import Finding, Unjudged
from tracer.record.verdict_sentence import _DETAIL, _culprit_detail, _n

_MS = 1_000_000
# A finding smaller than this explains nothing a person would act on.
MIN_EXCESS_MS = 10.0
# ... nor one smaller than this share of the model's normal TTFT.
EXCESS_SHARE = 0.25
# A proxy record's `llm.engine.source` -> the engine the action names.
_ENGINE_OF_SOURCE = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp",
                     "ollama": "Ollama"}
_CAUSE_ORDER = {name: i for i, name in enumerate(CAUSE_NAMES)}


@dataclass(slots=True, frozen=True)
class Verdict:
    """The cause of one request's TTFT. `findings` holds every cause that fired, the
    verdict's own first; `excess_ns` is how much of the TTFT the cause explains."""

    cause: str
    excess_ns: int | None
    evidence: dict
    findings: tuple[Finding, ...]
    ttft_ns: int | None
    engine: str | None = None               # whose knob the sentence names; None: all
    client_joined: bool = False             # the beacon's findings are in (judge_client)
    behind_long_prefill: bool = False       # the culprit is a long prompt's prefill
    cold: tuple[Unjudged, ...] = ()         # the rules that had too little history
    history_samples: int | None = None      # requests in the model's baseline when judged

    @property
    def excess_ms(self) -> float | None:
        return None if self.excess_ns is None else self.excess_ns / _MS

    @property
    def action(self) -> str:
        """The change to make: the named engine's knob, or every engine's."""
        cause = CAUSE_BY_NAME[self.cause]
        actions = BEHIND_LONG_PREFILL_ACTIONS if self.behind_long_prefill else cause.actions
        if self.engine is not None and self.engine in actions:
            return actions[self.engine]
        if len(set(actions.values())) == 1:     # the same change on every engine
            return next(iter(actions.values()))
        return "; ".join(f"{engine}: {knob}" for engine, knob in actions.items())

    def sentence(self) -> str:
        """One plain sentence for the UI: the cause, its numbers, and the change."""
        cause = CAUSE_BY_NAME[self.cause]
        if self.cause == HEALTHY.name:
            return "Healthy: every stage was within what is normal for this model and " \
                   "prompt length."
        if self.cause == UNJUDGED.name:
            e = self.evidence
            needed = (f"needed by {e['unjudged_causes'].replace(',', ', ')}"
                      if e["unjudged_causes"] else "needed to know this model's normal TTFT")
            return (f"Not judged, too little history: {_n(e['baseline_samples'])} of "
                    f"{_n(e['min_samples'])} requests so far ({needed}), and nothing that "
                    f"needs no history was found.")
        detail = _DETAIL[self.cause](self.evidence) + _culprit_detail(self.evidence)
        share = ""
        if self.excess_ns is not None and self.ttft_ns:
            # A client-side cause explains part of what the browser waited, not the server.
            whose, ttft_ms = "", self.ttft_ns / _MS
            if self.cause in CLIENT_CAUSES:
                whose, ttft_ms = "client ", self.evidence["client_ttft_ms"]
            share = (f" It explains {self.excess_ns / _MS:.0f} ms of the "
                     f"{ttft_ms:.0f} ms {whose}TTFT.")
        who = f" ({self.engine})" if self.engine in cause.actions else ""
        title = cause.title[0].upper() + cause.title[1:]
        return f"{title}: {detail}.{share} Change: {self.action}{who}."

    def fields(self) -> dict:
        """The verdict as log and API fields (JSON-ready)."""
        return {"cause": self.cause, "excess_ms": self.excess_ms,
                "evidence": dict(self.evidence), "action": self.action,
                "findings": [{"cause": f.cause, "excess_ms": None if f.excess_ns is None
                              else f.excess_ns / _MS} for f in self.findings]}


def judge(record: RequestRecord, baseline: ModelBaseline, context: Context,
          signals: Signals | None = None) -> Verdict:
    """The verdict of one finished record (one with a first token; else `healthy`, with
    no excess: a request that produced nothing has no TTFT to explain). `signals` are
    `Signals.of(record)`, when the caller has them already."""
    engine = engine_of(record)
    if record.ttft_ns is None:
        return Verdict(HEALTHY.name, 0, {"baseline_samples": None}, (), None, engine)
    signals = Signals.of(record) if signals is None else signals
    floor_ns = floor_of(baseline, record.ttft_ns)
    findings, cold = [], []
    for rule in RULES:
        outcome = rule(signals, baseline, context, floor_ns)
        if isinstance(outcome, Finding):
            findings.append(outcome)
        elif isinstance(outcome, Unjudged):
            cold.append(outcome)
    return _verdict(findings, record.ttft_ns, engine, tuple(cold), baseline.samples("ttft"))


def judge_client(verdict: Verdict, client: Mapping, baseline: ModelBaseline) -> Verdict:
    """The verdict with what the joined beacon adds: the network between the browser and
    the server, and an intermediary that held the stream back (`client` is the joined view,
    `RequestRecord.client`)."""
    network_ms = client.get("network_overhead_ms")
    client_ttft_ms = client.get("client_ttft_ms")
    if verdict.ttft_ns is None or not isinstance(network_ms, (int, float)) \
            or not isinstance(client_ttft_ms, (int, float)):
        return replace(verdict, client_joined=True)
    floor_ns = floor_of(baseline, verdict.ttft_ns)
    buffering = client.get("buffering") or {}
    normal_ms = baseline.median("network_ms")
    excess_ns = int((network_ms - (normal_ms or 0.0)) * _MS)
    evidence = {"client_ttft_ms": round(client_ttft_ms, 1),
                "server_ttft_ms": round(verdict.ttft_ns / _MS, 1),
                "network_ms": round(network_ms, 1),
                "normal_network_ms": None if normal_ms is None else round(normal_ms, 1),
                "baseline_samples": None if normal_ms is None
                else baseline.samples("network_ms")}
    finding = None
    if buffering.get("buffered"):
        held_ms = float(buffering.get("held_back_ms") or 0.0)
        finding = Finding(BUFFERING.name, max(excess_ns, int(held_ms * _MS)),
                          {"client_ttft_ms": round(client_ttft_ms, 1),
                           "network_ms": round(network_ms, 1),
                           "held_back_ms": round(held_ms, 1),
                           "buffered_chunks": buffering.get("num_events"),
                           "baseline_samples": None})   # the detector needs no history
    elif excess_ns >= floor_ns and network_ms * _MS >= verdict.ttft_ns:
        # The network dominates: more of the user's wait than the whole server TTFT.
        finding = Finding(NETWORK.name, excess_ns, evidence)
    if finding is None:
        return replace(verdict, client_joined=True)
    others = [f for f in verdict.findings if f.cause not in (NETWORK.name, BUFFERING.name)]
    return replace(_verdict(others + [finding], verdict.ttft_ns, verdict.engine, verdict.cold,
                            verdict.history_samples), client_joined=True)


def culprit_window(record: RequestRecord, verdict: Verdict) -> tuple[int, int] | None:
    """The part of the request's life whose neighbours the verdict's cause is about: the
    queue for `queueing`, the prefill for `slow_prefill`; None for any other cause."""
    return cause_window(record, verdict.cause, verdict.evidence.get("queue_stage"))


def cause_window(record: RequestRecord, cause: str,
                 queue_stage: str | None = None) -> tuple[int, int] | None:
    """The stage a `queueing` (`queue_stage`, else the first of QUEUE_STAGES the record has)
    or `slow_prefill` finding is about, as (start, end); None for any other cause or when
    the record has no such stage."""
    if cause == QUEUEING.name:
        names: tuple[str, ...] = (queue_stage or next(
            (n for n in QUEUE_STAGES if record.stage_ns(n) is not None), QUEUE_STAGES[0]),)
    elif cause == SLOW_PREFILL.name:
        names = next(((n,) for n in PREFILL_STAGES if record.stage_ns(n) is not None),
                     ("upstream_ttfb", "upstream_first_token"))
    else:
        return None
    spans = [s for s in record.stages if s.stage in names]
    if not spans:
        return None
    return min(s.start_ns for s in spans), max(s.end_ns for s in spans)


def name_culprits(verdict: Verdict, found: list[Neighbour], window_ns: int,
                  uncached_tokens: int) -> Verdict:
    """The verdict with the neighbours its window was spent behind (`found`, largest blame
    first): their count and the few that account for most of it (CULPRIT_EVIDENCE). When
    the first is a prompt at least LONG_PROMPT_FACTOR times this one's uncached length (and
    LONG_PROMPT_MIN_TOKENS) in its prefill, the action is the long-prefill knob."""
    evidence, behind_long = culprit_evidence(found, window_ns, uncached_tokens)
    evidence = {**verdict.evidence, **evidence}
    findings = tuple(replace(f, evidence=evidence, behind_long_prefill=behind_long)
                     if f is verdict.findings[0] else f for f in verdict.findings)
    return replace(verdict, evidence=evidence, findings=findings,
                   behind_long_prefill=behind_long)


def culprit_evidence(found: list[Neighbour], window_ns: int,
                     uncached_tokens: int) -> tuple[dict, bool]:
    """CULPRIT_EVIDENCE of a window spent behind `found` (largest blame first), and whether
    its first culprit is a long prompt's prefill (the long-prefill knob's case)."""
    named = culprits(found, window_ns)
    evidence = {"num_neighbours": sum(1 for n in found if n.blame_ns > 0)}
    if not named:
        return evidence, False
    top = named[0]
    evidence.update(culprit_trace_id=top["trace_id"], culprit_share=top["share"],
                    culprit_phase=top["phase"], culprit_prompt_tokens=top["prompt_tokens"],
                    culprits=named)
    long_tokens = top["prompt_tokens"] - top["cached_tokens"]
    behind_long = top["phase"] == "prefill" and long_tokens >= LONG_PROMPT_MIN_TOKENS \
        and long_tokens >= LONG_PROMPT_FACTOR * max(uncached_tokens, 1)
    return evidence, behind_long


def with_findings(verdict: Verdict, extra: list[Finding],
                  cold: tuple[Unjudged, ...] = ()) -> Verdict:
    """The verdict with more findings (the neighbours' blame, tracer/record/
    behind_neighbours.py; the whole path's backend, tracer/collect/path_verdict.py), and
    more rules that had too little history (`cold`), its cause picked again among all."""
    if not extra and not cold:
        return verdict
    return replace(_verdict(list(verdict.findings) + extra, verdict.ttft_ns, verdict.engine,
                            verdict.cold + cold, verdict.history_samples),
                   client_joined=verdict.client_joined)


def floor_of(baseline: ModelBaseline, ttft_ns: int) -> float:
    normal_ttft = baseline.median("ttft")
    return max(MIN_EXCESS_MS * _MS, EXCESS_SHARE * (normal_ttft or ttft_ns))


def engine_of(record: RequestRecord) -> str | None:
    """The engine whose knob the sentence names: ours, or the one a proxy joined."""
    if record.source == "engine":
        return "ttftscope engine"
    return _ENGINE_OF_SOURCE.get(str(record.attrs.get("llm.engine.source")))


def _verdict(findings: list[Finding], ttft_ns: int, engine: str | None,
             cold: tuple[Unjudged, ...] = (), history_samples: int | None = None) -> Verdict:
    young = history_samples is not None and history_samples < MIN_SAMPLES
    if not findings and (cold or young):
        # No history, no "healthy": how much there is, and which rules wanted more. A model
        # younger than MIN_SAMPLES requests has no normal TTFT, so no floor: nothing it
        # did can be called fine yet, even with every stage short.
        names = sorted({u.cause for u in cold}, key=_CAUSE_ORDER.__getitem__)
        samples = [u.samples for u in cold] + ([history_samples] if young else [])
        return Verdict(UNJUDGED.name, None, {
            "min_samples": MIN_SAMPLES, "unjudged_causes": ",".join(names),
            "baseline_samples": min(samples)}, (), ttft_ns, engine,
            cold=cold, history_samples=history_samples)
    if not findings:
        return Verdict(HEALTHY.name, 0, {"baseline_samples": history_samples}, (), ttft_ns,
                       engine, cold=cold, history_samples=history_samples)
    # Largest measured excess first; a finding with no baseline yet (cold start) after them.
    findings.sort(key=lambda f: (f.excess_ns is None, -(f.excess_ns or 0),
                                 _CAUSE_ORDER[f.cause]))
    top = findings[0]
    return Verdict(top.cause, top.excess_ns, top.evidence, tuple(findings), ttft_ns, engine,
                   behind_long_prefill=top.behind_long_prefill, cold=cold,
                   history_samples=history_samples)
