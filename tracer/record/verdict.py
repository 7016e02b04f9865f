"""One request's TTFT verdict: the cause, how much of the TTFT it explains, the evidence and
the change to make (docs/architecture.md, "Diagnosis").

`judge` is a pure function of the record and of what is normal for its model (a
`ModelBaseline`, `tracer.record.baselines`), the best overlap of its prompt with a recent
one (`tracer.record.prompt_overlap`) and how long the model had been idle. Each rule of
`tracer.record.causes` that fires yields a `Finding` with its excess over normal; the
verdict's cause is the finding with the largest excess (the vocabulary's order breaks a
tie), or `healthy` when none fires. A finding fires only when its excess is at least
`floor_ns`: `MIN_EXCESS_MS`, or `EXCESS_SHARE` of the model's normal TTFT if that is more.
Prefill is never blamed for being large: only for being larger than prompts of its length
usually take.

`judge_client` adds what the browser's beacon shows (network, buffering) once it joins.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tracer.record.baselines import ModelBaseline
from tracer.record.causes import (
    BUFFERING,
    CAUSE_BY_NAME,
    CAUSE_NAMES,
    CLIENT_CAUSES,
    COLD_PATH,
    CPU_PREPROCESSING,
    FIRST_PRINTABLE_LATE,
    HEALTHY,
    LONG_PROMPT,
    NETWORK,
    PREEMPTED,
    PREFIX_CACHE_MISS,
    QUEUEING,
    SLOW_PREFILL,
)
from tracer.record.prompt_overlap import Overlap
from tracer.record.request_record import RequestRecord

_MS = 1_000_000
# A finding smaller than this explains nothing a person would act on.
MIN_EXCESS_MS = 10.0
# ... nor one smaller than this share of the model's normal TTFT.
EXCESS_SHARE = 0.25
# Long prompt: at least this many times the model's usual uncached prompt, and this long.
LONG_PROMPT_FACTOR = 4.0
LONG_PROMPT_MIN_TOKENS = 256
# Slow prefill: at least this many times the prefill normal for its length.
SLOW_PREFILL_FACTOR = 1.5
# Prefix-cache miss: this share of the prompt's text was in one recent prompt, and the cache
# served at least `MISS_MIN_SHARE` of the prompt (and `MISS_MIN_TOKENS`) less than that.
MISS_MIN_SHARED = 0.5
MISS_MIN_SHARE = 0.25
MISS_MIN_TOKENS = 32
# Cold path: idle this long before the request (or the first request since start).
IDLE_COLD_S = 120.0
# The stages before the engine's queue: the host's own work on the request.
PREPROCESS_STAGES = ("receive", "template", "tokenize", "kv_lookup")
# Where a request waits for a batch slot: our engine's (or a joined engine's) queue, else,
# behind a proxy whose engine reports its prefill but no arrival (llama.cpp's `timings`),
# `upstream_other`, which then holds the wait for a slot (docs/architecture.md, "Diagnosis").
QUEUE_STAGES = ("queue", "upstream_other")
# Where a proxy without its engine's timing sees the engine's prefill (with its queue).
_UPSTREAM_ENGINE_STAGES = ("upstream_ttfb", "upstream_first_token")
# A proxy record's `llm.engine.source` -> the engine the action names.
_ENGINE_OF_SOURCE = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}
_CAUSE_ORDER = {name: i for i, name in enumerate(CAUSE_NAMES)}


@dataclass(slots=True, frozen=True)
class Finding:
    cause: str
    excess_ns: int | None                   # None: no baseline to measure it against yet
    evidence: dict = field(default_factory=dict)


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

    @property
    def excess_ms(self) -> float | None:
        return None if self.excess_ns is None else self.excess_ns / _MS

    @property
    def action(self) -> str:
        """The change to make: the named engine's knob, or every engine's."""
        cause = CAUSE_BY_NAME[self.cause]
        if self.engine is not None and self.engine in cause.actions:
            return cause.actions[self.engine]
        return cause.action()

    def sentence(self) -> str:
        """One plain sentence for the UI: the cause, its numbers, and the change."""
        cause = CAUSE_BY_NAME[self.cause]
        if self.cause == HEALTHY.name:
            return "Healthy: every stage was within what is normal for this model and " \
                   "prompt length."
        detail = _DETAIL[self.cause](self.evidence)
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


@dataclass(slots=True, frozen=True)
class Context:
    """What `judge` compares a record with, besides its model's baseline."""

    overlap: Overlap | None = None          # its prompt against recent ones
    requests_since_start: int = 0           # of this model, with a first token
    idle_s: float | None = None             # since the model's previous request ended


def judge(record: RequestRecord, baseline: ModelBaseline, context: Context,
          signals: Signals | None = None) -> Verdict:
    """The verdict of one finished record (one with a first token; else `healthy`, with
    no excess: a request that produced nothing has no TTFT to explain). `signals` are
    `Signals.of(record)`, when the caller has them already."""
    engine = engine_of(record)
    if record.ttft_ns is None:
        return Verdict(HEALTHY.name, 0, {}, (), None, engine)
    signals = Signals.of(record) if signals is None else signals
    floor_ns = floor_of(baseline, record.ttft_ns)
    findings = [f for rule in _RULES
                if (f := rule(signals, baseline, context, floor_ns)) is not None]
    return _verdict(findings, record.ttft_ns, engine)


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
                "normal_network_ms": None if normal_ms is None else round(normal_ms, 1)}
    finding = None
    if buffering.get("buffered"):
        held_ms = float(buffering.get("held_back_ms") or 0.0)
        finding = Finding(BUFFERING.name, max(excess_ns, int(held_ms * _MS)),
                          {"client_ttft_ms": round(client_ttft_ms, 1),
                           "network_ms": round(network_ms, 1),
                           "held_back_ms": round(held_ms, 1),
                           "buffered_chunks": buffering.get("num_events")})
    elif excess_ns >= floor_ns and network_ms * _MS >= verdict.ttft_ns:
        # The network dominates: more of the user's wait than the whole server TTFT.
        finding = Finding(NETWORK.name, excess_ns, evidence)
    if finding is None:
        return replace(verdict, client_joined=True)
    others = [f for f in verdict.findings if f.cause not in (NETWORK.name, BUFFERING.name)]
    return replace(_verdict(others + [finding], verdict.ttft_ns, verdict.engine),
                   client_joined=True)


def floor_of(baseline: ModelBaseline, ttft_ns: int) -> float:
    normal_ttft = baseline.median("ttft")
    return max(MIN_EXCESS_MS * _MS, EXCESS_SHARE * (normal_ttft or ttft_ns))


def engine_of(record: RequestRecord) -> str | None:
    """The engine whose knob the sentence names: ours, or the one a proxy joined."""
    if record.source == "engine":
        return "ttftscope engine"
    return _ENGINE_OF_SOURCE.get(str(record.attrs.get("llm.engine.source")))


def _verdict(findings: list[Finding], ttft_ns: int, engine: str | None) -> Verdict:
    if not findings:
        return Verdict(HEALTHY.name, 0, {}, (), ttft_ns, engine)
    # Largest measured excess first; a finding with no baseline yet (cold start) after them.
    findings.sort(key=lambda f: (f.excess_ns is None, -(f.excess_ns or 0),
                                 _CAUSE_ORDER[f.cause]))
    top = findings[0]
    return Verdict(top.cause, top.excess_ns, top.evidence, tuple(findings), ttft_ns, engine)


@dataclass(slots=True, frozen=True)
class Signals:
    """The numbers of one record the rules read."""

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

    @property
    def uncached_tokens(self) -> int:
        return max(self.prompt_tokens - self.cached_tokens, 0)

    @classmethod
    def of(cls, record: RequestRecord) -> Signals:
        stage_ns = {s.stage: s.duration_ns for s in record.stages}
        attrs = {s.stage: s.attrs for s in record.stages}
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
            max_batch_size=max_batch)


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
    baseline.num_requests += 1
    baseline.last_end_ns = record.end_ns


def _ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / _MS, 1)


# -- the rules: one per cause, each (signals, baseline, context, floor) -> Finding | None ----

def _preempted(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Finding | None:
    if not s.num_preemptions or s.prefill_ns is None:
        return None
    expected = b.expected_prefill_ns(s.uncached_tokens) or 0.0
    excess = int(s.prefill_ns + s.stage_ns.get("queue", 0) - expected
                 - (b.median("queue") or 0.0))
    return Finding(PREEMPTED.name, max(excess, 0),
                   {"num_preemptions": s.num_preemptions, "prefill_ms": _ms(s.prefill_ns)})


def _cold_path(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Finding | None:
    evidence = {"requests_since_start": c.requests_since_start,
                "idle_s": None if c.idle_s is None else round(c.idle_s, 1)}
    if c.requests_since_start == 0:
        return Finding(COLD_PATH.name, None, evidence)   # nothing is known of normal yet
    normal = b.median("ttft")
    if c.idle_s is None or c.idle_s < IDLE_COLD_S or normal is None:
        return None
    excess = s.ttft_ns - normal
    return Finding(COLD_PATH.name, int(excess), evidence) if excess >= floor_ns else None


def _queueing(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Finding | None:
    stage = next((st for st in QUEUE_STAGES if st in s.stage_ns), None)
    if stage is None:
        return None
    queue_ns = s.stage_ns[stage]
    normal = b.median(stage) or 0.0     # a queue's ideal is empty
    excess = queue_ns - normal
    if excess < floor_ns:
        return None
    return Finding(QUEUEING.name, int(excess), {
        "queue_stage": stage, "queue_ms": _ms(queue_ns), "normal_queue_ms": _ms(normal),
        "num_waiting_at_arrival": s.num_waiting, "num_running_at_arrival": s.num_running})


def _long_prompt(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Finding | None:
    usual = b.usual_uncached_tokens()
    # Judged on what a working prefix cache would have left to prefill: tokens a recent
    # prompt shared and the cache missed are the miss's, not the length's.
    n = s.uncached_tokens - _missed_tokens(s, c)
    if s.prefill_ns is None or usual is None or n < LONG_PROMPT_MIN_TOKENS \
            or n < LONG_PROMPT_FACTOR * max(usual, 1.0):
        return None
    # The part of the prefill beyond what the usual length would take, at this one's rate.
    excess = s.prefill_ns * (1.0 - usual / n)
    if excess < floor_ns:
        return None
    return Finding(LONG_PROMPT.name, int(excess), {
        "uncached_tokens": n, "usual_uncached_tokens": round(usual),
        "prefill_ms": _ms(s.prefill_ns)})


def _missed_tokens(s: Signals, c: Context) -> int:
    """Prompt tokens a recent prompt shared that the prefix cache did not serve; 0 below
    the miss rule's thresholds."""
    overlap = c.overlap
    if overlap is None or overlap.shared_fraction < MISS_MIN_SHARED or s.uncached_tokens <= 0:
        return 0
    cacheable = int(overlap.shared_fraction * s.prompt_tokens)
    missed = min(cacheable - s.cached_tokens, s.uncached_tokens)
    return missed if missed >= max(MISS_MIN_TOKENS, MISS_MIN_SHARE * s.prompt_tokens) else 0


def _prefix_cache_miss(s: Signals, b: ModelBaseline, c: Context,
                       floor_ns: float) -> Finding | None:
    missed = _missed_tokens(s, c)
    if not missed or s.prefill_ns is None:
        return None
    overlap = c.overlap
    cacheable = int(overlap.shared_fraction * s.prompt_tokens)
    excess = s.prefill_ns * missed / s.uncached_tokens
    if excess < floor_ns:
        return None
    return Finding(PREFIX_CACHE_MISS.name, int(excess), {
        "shared_fraction": round(overlap.shared_fraction, 2), "cached_tokens": s.cached_tokens,
        "prompt_tokens": s.prompt_tokens, "cacheable_tokens": cacheable,
        "shared_with_trace_id": overlap.trace_id})


def _slow_prefill(s: Signals, b: ModelBaseline, c: Context, floor_ns: float) -> Finding | None:
    n = s.uncached_tokens
    expected = b.expected_prefill_ns(n) if s.prefill_ns is not None else None
    if expected is None or s.prefill_ns < SLOW_PREFILL_FACTOR * expected:
        return None
    excess = s.prefill_ns - expected
    if excess < floor_ns:
        return None
    return Finding(SLOW_PREFILL.name, int(excess), {
        "prefill_ms": _ms(s.prefill_ns), "expected_prefill_ms": _ms(expected),
        "prefill_ms_per_token": round(s.prefill_ns / _MS / n, 3),
        "normal_prefill_ms_per_token": round(expected / _MS / n, 3),
        "uncached_tokens": n, "max_batch_size": s.max_batch_size})


def _cpu_preprocessing(s: Signals, b: ModelBaseline, c: Context,
                       floor_ns: float) -> Finding | None:
    normal = b.median("preprocess")
    if s.preprocess_ns is None or normal is None:
        return None
    excess = s.preprocess_ns - normal
    if excess < floor_ns:
        return None
    slowest = max((st for st in PREPROCESS_STAGES if st in s.stage_ns),
                  key=lambda st: s.stage_ns[st] - (b.median(st) or 0.0))
    return Finding(CPU_PREPROCESSING.name, int(excess), {
        "preprocess_ms": _ms(s.preprocess_ns), "normal_preprocess_ms": _ms(normal),
        "slowest_stage": slowest})


def _first_printable_late(s: Signals, b: ModelBaseline, c: Context,
                          floor_ns: float) -> Finding | None:
    detok_ns = s.stage_ns.get("detokenize")
    if s.tokens_before_text < 2 or detok_ns is None:
        return None
    # No floor: the evidence is the token count, not a noisy duration, and the excess is
    # exactly the extra decode steps (one step can be under the floor on a fast engine).
    excess = detok_ns - (b.median("detokenize") or 0.0)
    if excess <= 0:
        return None
    return Finding(FIRST_PRINTABLE_LATE.name, int(excess), {
        "tokens_before_text": s.tokens_before_text, "detokenize_ms": _ms(detok_ns)})


_RULES = (_preempted, _cold_path, _queueing, _long_prompt, _prefix_cache_miss, _slow_prefill,
          _cpu_preprocessing, _first_printable_late)


def _n(value) -> str:
    return "?" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


# The sentence's middle, per cause, from its evidence.
_DETAIL = {
    QUEUEING.name: lambda e: (
        f"waited {_n(e['queue_ms'])} ms in {e['queue_stage']} against a normal "
        f"{_n(e['normal_queue_ms'])} ms" + (
            "" if e["num_waiting_at_arrival"] is None and e["num_running_at_arrival"] is None
            else f", with {_n(e['num_waiting_at_arrival'])} waiting and "
                 f"{_n(e['num_running_at_arrival'])} running at arrival")),
    LONG_PROMPT.name: lambda e: (
        f"{_n(e['uncached_tokens'])} uncached prompt tokens against a usual "
        f"{_n(e['usual_uncached_tokens'])}, prefilled in {_n(e['prefill_ms'])} ms"),
    PREFIX_CACHE_MISS.name: lambda e: (
        f"{e['shared_fraction']:.0%} of the prompt's text was in a recent prompt, yet only "
        f"{_n(e['cached_tokens'])} of {_n(e['prompt_tokens'])} tokens came from the prefix "
        f"cache (about {_n(e['cacheable_tokens'])} could have): the shared text does not "
        f"start the prompt, or the cache is off"),
    SLOW_PREFILL.name: lambda e: (
        f"prefill took {_n(e['prefill_ms'])} ms for {_n(e['uncached_tokens'])} tokens, "
        f"{_n(e['prefill_ms_per_token'])} ms a token against a normal "
        f"{_n(e['normal_prefill_ms_per_token'])}, in steps of up to "
        f"{_n(e['max_batch_size'])} requests"),
    CPU_PREPROCESSING.name: lambda e: (
        f"receive to KV lookup took {_n(e['preprocess_ms'])} ms against a normal "
        f"{_n(e['normal_preprocess_ms'])} ms, most in {e['slowest_stage']}"),
    NETWORK.name: lambda e: (
        f"the browser waited {_n(e['client_ttft_ms'])} ms, the server {_n(e['server_ttft_ms'])}"
        f" ms: {_n(e['network_ms'])} ms between them, " + (
            "with no normal measured yet" if e["normal_network_ms"] is None
            else f"against a normal {_n(e['normal_network_ms'])} ms")),
    BUFFERING.name: lambda e: (
        f"{_n(e['held_back_ms'])} ms of the stream was held back and released at once "
        f"({_n(e['network_ms'])} ms between the server and the browser)"),
    FIRST_PRINTABLE_LATE.name: lambda e: (
        f"{_n(e['tokens_before_text'])} tokens were generated before the first printable "
        f"text, {_n(e['detokenize_ms'])} ms after the first token"),
    COLD_PATH.name: lambda e: (
        f"the first request since start" if e["requests_since_start"] == 0 else
        f"the first request after {_n(e['idle_s'])} s idle"),
    PREEMPTED.name: lambda e: (
        f"preempted {_n(e['num_preemptions'])} times before its first token, its prefill "
        f"({_n(e['prefill_ms'])} ms) recomputed"),
}
