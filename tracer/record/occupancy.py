"""A request as an interval on the server's timeline, split into phases: what the timeline
and the neighbours read (docs/reference.md, "Timeline and neighbours").

A phase (`tracer.record.stages.PHASES`) folds the stages of either front into what a request
is doing for the engine: preprocessing, waiting for a slot, prefilling, producing its first
token, decoding. A finished request's phases come from its record; an in-flight one's from
a snapshot of its timeline, with the stage it is in now running to `now_ns`.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.record.attribution import attribute
from tracer.record.request_record import RequestRecord
from tracer.record.timeline import TimelineSnapshot

# Every stage of either front (tracer/record/stages.py) -> its phase. Behind a proxy without
# its engine's timing the upstream's first token holds the engine's queue and prefill: it is
# `prefill`, the wait the proxy can least split (docs/architecture.md, "Neighbours").
PHASE_OF_STAGE = {
    "receive": "preprocess", "template": "preprocess", "tokenize": "preprocess",
    "kv_lookup": "preprocess", "upstream_connect": "preprocess",
    "upstream_request": "preprocess",
    "queue": "queue", "upstream_other": "queue",
    # Ollama's wait for a runner (a cold load): the request waits, it holds no batch slot.
    "model_load": "queue",
    "prefill": "prefill", "inference": "prefill", "engine_other": "prefill",
    # The prefill worker's KV cache leaving for the decode worker: the end of the prefill's
    # work for the first token, as engine_other is, not a wait for a slot.
    "kv_transfer": "prefill",
    "upstream_ttfb": "prefill", "upstream_first_token": "prefill",
    "sample": "first_token", "detokenize": "first_token", "send": "first_token",
    "upstream_response": "first_token",
}
# A request in flight behind a proxy, before the upstream's first token, may still wait for
# a slot or be prefilling: only its finished record (joined with the engine's timing) tells
# them apart. Until then that time is drawn as queued and holds no blame: a burst's waiting
# requests would otherwise share the blame of the one holding the slot.
_IN_FLIGHT_PHASE_OF_STAGE = {**PHASE_OF_STAGE, "upstream_ttfb": "queue",
                             "upstream_first_token": "queue"}
# Phases during which a request holds the engine (a batch slot, compute), not waits for it.
BUSY_PHASES = frozenset(("prefill", "first_token", "decode"))


@dataclass(slots=True, frozen=True)
class Occupancy:
    """One request's interval and phases, perf_counter_ns. `phases` are (phase, start, end),
    in order, same-phase neighbours merged; `end_ns` is `now` for one in flight."""

    trace_id: str
    request_id: str
    model: str
    start_ns: int
    end_ns: int
    ttft_end_ns: int | None
    phases: tuple[tuple[str, int, int], ...]
    num_prompt_tokens: int
    num_cached_tokens: int
    cause: str | None = None
    in_flight: bool = False

    def phase_ns_within(self, from_ns: int, to_ns: int) -> dict[str, int]:
        """How long it spent in each phase inside [from_ns, to_ns]."""
        out: dict[str, int] = {}
        for phase, start, end in self.phases:
            ns = min(end, to_ns) - max(start, from_ns)
            if ns > 0:
                out[phase] = out.get(phase, 0) + ns
        return out


def of_record(record: RequestRecord) -> Occupancy:
    """A finished request.

    >>> from tracer.record.request_record import StageSpan
    >>> r = RequestRecord("r1", "1" * 32, "2" * 16, "m", "chat", 0, 100, ttft_ns=40,
    ...                   stages=(StageSpan("receive", 0, 5), StageSpan("queue", 5, 20),
    ...                           StageSpan("prefill", 20, 35), StageSpan("send", 35, 40)))
    >>> of_record(r).phases
    (('preprocess', 0, 5), ('queue', 5, 20), ('prefill', 20, 35), ('first_token', 35, 40), ('decode', 40, 100))
    """
    spans = [(PHASE_OF_STAGE.get(s.stage, "preprocess"), s.start_ns, s.end_ns)
             for s in record.stages]
    ttft_end = None if record.ttft_ns is None else record.start_ns + record.ttft_ns
    if ttft_end is not None:
        spans.append(("decode", ttft_end, record.end_ns))
    verdict = record.verdict
    return Occupancy(record.trace_id, record.request_id, record.model, record.start_ns,
                     record.end_ns, ttft_end, _merged(spans), record.num_prompt_tokens,
                     record.num_cached_tokens, getattr(verdict, "cause", None))


def of_snapshot(snap: TimelineSnapshot, stages: tuple[str, ...], *, request_id: str,
                trace_id: str, model: str, now_ns: int) -> Occupancy:
    """A request in flight: its stages so far, and the stage it is in now up to `now_ns`
    (the one after its last boundary; decode once its first content left)."""
    attribution = attribute(snap, stages)
    phase_of = _IN_FLIGHT_PHASE_OF_STAGE
    spans = [(phase_of.get(s.stage, "preprocess"), s.start_ns, s.end_ns)
             for s in attribution.spans]
    last_ns = max([snap.start_ns, *snap.marks_ns.values()])
    ttft_end = snap.first_emits_ns[0] if snap.first_emits_ns else None
    if ttft_end is not None:
        spans.append(("decode", ttft_end, max(now_ns, ttft_end)))
    else:
        marked = [i for i, stage in enumerate(stages) if stage in snap.marks_ns]
        current = stages[marked[-1] + 1] if marked and marked[-1] + 1 < len(stages) \
            else stages[0] if not marked else stages[-1]
        spans.append((phase_of.get(current, "preprocess"), last_ns, max(now_ns, last_ns)))
    attrs = snap.stage_attrs
    return Occupancy(trace_id, request_id, model, snap.start_ns, max(now_ns, last_ns),
                     ttft_end, _merged(spans),
                     int(attrs.get(("tokenize", "num_prompt_tokens")) or 0),
                     int(attrs.get(("kv_lookup", "num_hit_tokens")) or 0), None, True)


def _merged(spans: list[tuple[str, int, int]]) -> tuple[tuple[str, int, int], ...]:
    out: list[tuple[str, int, int]] = []
    for phase, start, end in spans:
        if end < start:
            continue
        if out and out[-1][0] == phase and out[-1][2] == start:
            out[-1] = (phase, out[-1][1], end)
        else:
            out.append((phase, start, end))
    return tuple(out)
