"""A window of verdicts, ranked: which causes cost the most TTFT, and their slowest requests.

One ranking for every reader: `/ui/api/diagnosis` over the trace store, and
`python -m tracer diagnose` over a `request_finished` log or a live server's API
(docs/architecture.md, "Diagnosis"). A request costs its cause `ttft − slo` seconds above the
SLO and `ttft − p95` above the window's own p95 (each floored at 0), and `excess` seconds
above normal. Causes are ranked by the seconds above the SLO, then above p95, then excess:
what breaks the promise first, then what makes the tail, then what is merely slower than
usual.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tracer.record.causes import CAUSE_BY_NAME, HEALTHY, NO_CAUSE

# The default TTFT objective: the server TTFT p95 above which `LLMTTFTP95High` pages
# (dashboards/thresholds.py reads it from here).
DEFAULT_TTFT_SLO_S = 2.0
SLOWEST_PER_CAUSE = 3


@dataclass(slots=True, frozen=True)
class VerdictRow:
    """One judged request, as a log line or the store holds it."""

    trace_id: str
    model: str
    cause: str
    ttft_ms: float
    excess_ms: float | None = None
    engine: str | None = None      # whose knob the verdict named (Verdict.engine)


def p95(values: list[float]) -> float | None:
    """The nearest-rank 95th percentile.

    >>> p95(list(range(1, 101))), p95([])
    (95, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def rank_causes(rows: Iterable[VerdictRow], *, slo_ms: float = DEFAULT_TTFT_SLO_S * 1e3,
                slowest: int = SLOWEST_PER_CAUSE) -> dict:
    """The window's causes, costliest first, with the slowest requests of each.

    >>> rows = [VerdictRow("a" * 32, "m", "queueing", 3000.0, 2900.0),
    ...         VerdictRow("b" * 32, "m", "healthy", 100.0, 0.0),
    ...         VerdictRow("d" * 32, "m", "unjudged", 4000.0, None),
    ...         VerdictRow("c" * 32, "m", "long_prompt", 1500.0, 1200.0)]
    >>> out = rank_causes(rows, slo_ms=2000)
    >>> [(c["cause"], c["above_slo_s"], c["excess_s"]) for c in out["causes"]]
    [('queueing', 1.0, 2.9), ('long_prompt', 0.0, 1.2), ('unjudged', 2.0, 0.0), ('healthy', 0.0, 0.0)]
    """
    rows = [r for r in rows if r.ttft_ms is not None and math.isfinite(r.ttft_ms)]
    tail_ms = p95([r.ttft_ms for r in rows])
    by_cause: dict[str, list[VerdictRow]] = {}
    for row in rows:
        cause = row.cause if row.cause in CAUSE_BY_NAME else HEALTHY.name
        by_cause.setdefault(cause, []).append(row)
    causes = []
    for cause, members in by_cause.items():
        members.sort(key=lambda r: (-r.ttft_ms, r.trace_id))   # any input order, one answer
        causes.append({
            "cause": cause,
            "title": CAUSE_BY_NAME[cause].title,
            "num_requests": len(members),
            "above_slo_s": round(sum(max(r.ttft_ms - slo_ms, 0.0) for r in members) / 1e3, 3),
            "above_p95_s": round(sum(max(r.ttft_ms - tail_ms, 0.0) for r in members) / 1e3, 3),
            "excess_s": round(sum(max(r.excess_ms or 0.0, 0.0) for r in members) / 1e3, 3),
            "action": _action(cause, {r.engine for r in members}),
            "slowest": [{"trace_id": r.trace_id, "ttft_ms": round(r.ttft_ms, 1)}
                        for r in members[:slowest]],
        })
    # The outcomes that name no cause (healthy, unjudged) come last, whatever they cost.
    causes.sort(key=lambda c: (c["cause"] in NO_CAUSE, -c["above_slo_s"],
                               -c["above_p95_s"], -c["excess_s"], c["cause"]))
    return {"num_requests": len(rows), "slo_ms": slo_ms,
            "p95_ms": None if tail_ms is None else round(tail_ms, 1), "causes": causes}


def _action(cause: str, engines: set) -> str:
    """One engine's knob when every request of the cause ran on the same engine, else all."""
    knobs = CAUSE_BY_NAME[cause].actions
    if len(engines) == 1 and (engine := next(iter(engines))) in knobs:
        return f"{knobs[engine]} ({engine})"
    return CAUSE_BY_NAME[cause].action()


def row_of_log(line: dict) -> VerdictRow | None:
    """A `request_finished` log line's verdict (tracer/sinks/logs.py), or None when the line
    is another event or carries no verdict or no TTFT."""
    if line.get("event") != "request_finished":
        return None
    cause, ttft_ms = line.get("cause"), line.get("ttft_ms")
    if not isinstance(cause, str) or not isinstance(ttft_ms, (int, float)) \
            or isinstance(ttft_ms, bool):
        return None
    excess, engine = line.get("excess_ms"), line.get("engine")
    return VerdictRow(str(line.get("trace_id", "")), str(line.get("model", "")), cause,
                      float(ttft_ms), float(excess) if isinstance(excess, (int, float)) else None,
                      engine if isinstance(engine, str) else None)
