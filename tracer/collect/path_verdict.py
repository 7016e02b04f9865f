"""The TTFT verdict of a whole-path record (docs/architecture.md, "The whole path"): the
engine's causes, as the engine's and the proxy's records get them, and the backend's own.

The record's segments are named by their spans; only its engine segments (queue, prefill,
kv_transfer, tokenize, ...) are judged by the engine's rules (`tracer.record.verdict.judge`),
so a backend span that happens to be called `queue` is never read as one. The backend rule
compares each backend label's time on the critical path with that label's median, per
model: a label is a closed-set name (`SegmentNames`), so the series are bounded; `other`
mixes names and has no normal. The verdict is the finding with the largest excess over
normal, as everywhere, against the same floor (10 ms, or a quarter of the normal TTFT).
The TTFT judged is the record's: the backend's root span's start to the engine's first
token.
"""
from __future__ import annotations

from dataclasses import replace

from tracer.record.baselines import Baselines
from tracer.record.causes import BACKEND
from tracer.record.diagnosis_signals import Context, Signals, observe
from tracer.record.request_record import RequestRecord
from tracer.record.rule_outcome import Finding, Unjudged
from tracer.record.segment_names import OTHER
from tracer.record.verdict import floor_of, judge, with_findings

_SERIES = "backend/"
_MS = 1_000_000


class PathDiagnoser:
    """Sets `record.verdict` on each whole-path record with a first token, then learns it."""

    def __init__(self, baselines: Baselines | None = None) -> None:
        self.baselines = Baselines() if baselines is None else baselines

    def judge(self, record: RequestRecord) -> None:
        if record.ttft_ns is None:
            return
        engine = replace(record, stages=tuple(s for s in record.stages
                                              if s.attrs.get("part") == "engine"))
        backend = _backend_labels(record)
        with self.baselines.lock:
            baseline = self.baselines.of(record.model)
            signals = Signals.of(engine)
            verdict = judge(engine, baseline, Context.of(baseline, record.start_ns), signals)
            found = _backend_outcome(backend, baseline, floor_of(baseline, record.ttft_ns))
            record.verdict = with_findings(
                verdict, [found] if isinstance(found, Finding) else [],
                (found,) if isinstance(found, Unjudged) else ())
            observe(baseline, engine, signals)
            for label, (ns, _) in backend.items():
                baseline.add(_SERIES + label, ns)


def _backend_labels(record: RequestRecord) -> dict[str, tuple[int, object]]:
    """label -> (its time on the path, its longest segment), `other` left out."""
    out: dict[str, tuple[int, object]] = {}
    for s in record.stages:
        label = s.attrs.get("label")
        if s.attrs.get("part") != "backend" or not label or label == OTHER:
            continue
        ns, top = out.get(label, (0, s))
        out[label] = (ns + s.duration_ns, s if s.duration_ns > top.duration_ns else top)
    return out


def _backend_outcome(backend: dict, baseline, floor_ns: float) -> Finding | Unjudged | None:
    """The backend label furthest above its normal; `Unjudged` when none was but one at
    least the floor long had no normal yet (fewer than MIN_SAMPLES of it)."""
    best, cold = None, None
    for label, (ns, top) in backend.items():
        if ns < floor_ns:
            continue                    # under the floor whatever is normal
        normal = baseline.median(_SERIES + label)
        if normal is None:
            samples = baseline.samples(_SERIES + label)
            cold = samples if cold is None else min(cold, samples)
        elif ns - normal >= floor_ns and (best is None or ns - normal > best[0]):
            best = (ns - normal, label, ns, normal, top)
    if best is None:
        return None if cold is None else Unjudged(BACKEND.name, cold)
    excess, label, ns, normal, top = best
    return Finding(BACKEND.name, int(excess), {
        "segment": label, "segment_ms": round(ns / _MS, 1),
        "normal_segment_ms": round(normal / _MS, 1), "span_id": top.attrs.get("span_id", ""),
        "service": top.attrs.get("service", ""),
        "baseline_samples": baseline.samples(_SERIES + label)})
