"""The neighbours' rule: a queue or a prefill spent behind other requests' work, judged with
no history (docs/architecture.md, "Diagnosis").

`queueing` and `slow_prefill` compare a request with its model's usual queue and its
length's usual prefill, which a fresh engine does not know yet. The engine's step record
knows something better than a usual: whose tokens filled each step while this request
waited or prefilled (`tracer.record.neighbours`, blame by tokens). When most of the TTFT
went to other requests' prefill or decode, the request was slow because of them, whatever
is normal, and the finding names them. So for a stage whose rule had too little history
(`Unjudged`), the blame inside that stage becomes the finding's excess:

- it fires only when the blame over the queue and the prefill together is at least
  `MIN_BLAME_SHARE` of the TTFT ("most of it"), and a stage's own blame is at least the
  floor;
- only with the step record (our engine): behind a proxy the blame is a fair share of the
  moments others held the engine, not a measurement (a foreign engine may batch them at no
  cost to this request), so there the stages wait for their baseline.

With a baseline the stage rules judge against it, and a verdict of theirs names its culprits
the same way (`tracer.record.verdict.name_culprits`): under steady load every request shares
its steps, and only a share above the usual one explains TTFT above normal.
"""
from __future__ import annotations

from collections.abc import Mapping

from tracer.record.causes import CULPRIT_EVIDENCE, QUEUEING, SLOW_PREFILL
from tracer.record.cause_rules import QUEUE_STAGES
from tracer.record.diagnosis_signals import Signals
from tracer.record.neighbours import Neighbour
from tracer.record.rule_outcome import Finding, Unjudged
from tracer.record.verdict import culprit_evidence

# "Most of a TTFT": the neighbours' blame over the stages asked must reach this share of it.
MIN_BLAME_SHARE = 0.5
# The causes whose stage this rule can judge without history.
CAUSES = (QUEUEING.name, SLOW_PREFILL.name)
_MS = 1_000_000


def stages_to_ask(cold: tuple[Unjudged, ...]) -> tuple[str, ...]:
    """The causes among `CAUSES` whose rule had too little history for this record."""
    wanted = {u.cause for u in cold}
    return tuple(c for c in CAUSES if c in wanted)


def findings(signals: Signals, asked: Mapping[str, tuple[int, list[Neighbour]]],
             floor_ns: float) -> list[Finding]:
    """The findings of the stages in `asked` (cause → (its stage's length in ns, the
    neighbours inside it, largest blame first)), or none when their blame is not most of
    the TTFT.

    >>> from tracer.record.occupancy import Occupancy
    >>> long = Occupancy("a" * 32, "ra", "m", 0, 900, 900, (("prefill", 0, 900),), 4000, 0)
    >>> behind = [Neighbour(long, 400, 380, {"prefill": 400}, 2)]
    >>> s = Signals(ttft_ns=420, stage_ns={"queue": 10, "prefill": 400}, prompt_tokens=37,
    ...             cached_tokens=0, prefill_ns=400, preprocess_ns=1, num_waiting=0,
    ...             num_running=1, num_preemptions=0, tokens_before_text=1, max_batch_size=2)
    >>> [f] = findings(s, {"slow_prefill": (400, behind)}, floor_ns=105)
    >>> f.cause, f.excess_ns, f.evidence["culprit_trace_id"][:4], f.behind_long_prefill
    ('slow_prefill', 380, 'aaaa', True)
    >>> findings(s, {"slow_prefill": (400, behind[:0])}, floor_ns=105)
    []
    """
    blames = {cause: sum(n.blame_ns for n in found) for cause, (_, found) in asked.items()}
    if sum(blames.values()) < MIN_BLAME_SHARE * signals.ttft_ns:
        return []
    out = []
    for cause, (window_ns, found) in asked.items():
        blame_ns = blames[cause]
        if blame_ns < floor_ns:
            continue
        culprits, behind_long = culprit_evidence(found, window_ns, signals.uncached_tokens)
        out.append(Finding(cause, blame_ns, {
            **_stage_evidence(cause, signals), **dict.fromkeys(CULPRIT_EVIDENCE), **culprits,
            "baseline_samples": None}, behind_long_prefill=behind_long))
    return out


def _stage_evidence(cause: str, s: Signals) -> dict:
    """The cause's own evidence, with no normal to compare with (None)."""
    if cause == QUEUEING.name:
        stage = next((st for st in QUEUE_STAGES if st in s.stage_ns), QUEUE_STAGES[0])
        return {"queue_stage": stage, "queue_ms": round(s.stage_ns.get(stage, 0) / _MS, 1),
                "normal_queue_ms": None, "num_waiting_at_arrival": s.num_waiting,
                "num_running_at_arrival": s.num_running}
    n, prefill_ns = s.uncached_tokens, s.prefill_ns or 0
    return {"prefill_ms": round(prefill_ns / _MS, 1), "expected_prefill_ms": None,
            "prefill_ms_per_token": round(prefill_ns / _MS / n, 3) if n else None,
            "normal_prefill_ms_per_token": None, "uncached_tokens": n,
            "max_batch_size": s.max_batch_size}
