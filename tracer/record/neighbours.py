"""What a request waited behind: the requests that overlapped a window of its life, and how
much of that window each accounts for (docs/architecture.md, "Neighbours").

`blame_ns` is the share of the window a neighbour held the engine:
- with the engine's step record (our engine), every step inside the window is split among
  the requests in it by their tokens in it (a 475-token prefill chunk beside a 37-token one
  holds 475/512 of that step): the step record says exactly whose compute the wait was;
- without it (a proxy in front of a foreign engine), every moment of the window is split
  evenly among the neighbours holding the engine then (prefill, first token or decode: not
  those queued themselves).
So the blames sum to at most the window, and the largest is the culprit.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tracer.record.occupancy import BUSY_PHASES, Occupancy

MAX_NEIGHBOURS = 20
_MS = 1_000_000


@dataclass(slots=True, frozen=True)
class Neighbour:
    occupancy: Occupancy
    overlap_ns: int                 # its server interval inside the window
    blame_ns: int                   # the part of the window it accounts for
    phases_ns: dict                 # its phases inside the window
    num_shared_steps: int           # steps holding both (step record only)

    @property
    def phase(self) -> str:
        """What it mostly did during the window."""
        return max(self.phases_ns.items(), key=lambda kv: kv[1])[0] if self.phases_ns \
            else "preprocess"

    def fields(self) -> dict:
        o = self.occupancy
        return {"trace_id": o.trace_id, "request_id": o.request_id,
                "overlap_ms": self.overlap_ns / _MS, "blame_ms": self.blame_ns / _MS,
                "phase": self.phase,
                "phases_ms": {p: ns / _MS for p, ns in self.phases_ns.items()},
                "num_prompt_tokens": o.num_prompt_tokens,
                "num_cached_tokens": o.num_cached_tokens,
                "num_shared_steps": self.num_shared_steps, "in_flight": o.in_flight}


def neighbours(target: Occupancy, others: Iterable[Occupancy], from_ns: int, to_ns: int,
               steps: Sequence | None = None) -> list[Neighbour]:
    """Every other request overlapping [from_ns, to_ns], the largest blame first (then the
    largest overlap). `steps`: the engine's steps overlapping the window (objects with
    `start_ns`, `end_ns`, `request_ids`, `num_tokens`), or None when there is no record.

    >>> a = Occupancy("a" * 32, "ra", "m", 0, 100, 10, (("prefill", 0, 10), ("decode", 10, 100)), 9, 0)
    >>> b = Occupancy("b" * 32, "rb", "m", 5, 60, 50, (("queue", 5, 40), ("prefill", 40, 50)), 3, 0)
    >>> [(n.occupancy.request_id, n.blame_ns, n.phase) for n in neighbours(b, [a], 5, 50)]
    [('ra', 45, 'decode')]
    """
    found: dict[str, tuple[Occupancy, int]] = {}
    for o in others:
        if o.request_id == target.request_id or o.request_id in found:
            continue
        overlap = min(o.end_ns, to_ns) - max(o.start_ns, from_ns)
        if overlap > 0:
            found[o.request_id] = (o, max(overlap, 0))
    if steps is not None:
        blame, shared = _blame_by_steps(target.request_id, steps, from_ns, to_ns)
    else:
        blame, shared = _blame_by_sweep([o for o, _ in found.values()], from_ns, to_ns), {}
    out = [Neighbour(o, overlap, int(blame.get(rid, 0)), o.phase_ns_within(from_ns, to_ns),
                     shared.get(rid, 0)) for rid, (o, overlap) in found.items()]
    out.sort(key=lambda n: (-n.blame_ns, -n.overlap_ns, n.occupancy.start_ns))
    return out


def _blame_by_steps(target_id: str, steps: Sequence, from_ns: int,
                    to_ns: int) -> tuple[dict[str, float], dict[str, int]]:
    blame: dict[str, float] = {}
    shared: dict[str, int] = {}
    for step in steps:
        overlap = min(step.end_ns, to_ns) - max(step.start_ns, from_ns)
        total = sum(step.num_tokens)
        if overlap <= 0 or total <= 0:
            continue
        with_target = target_id in step.request_ids
        for rid, n in zip(step.request_ids, step.num_tokens):
            if rid == target_id:
                continue
            blame[rid] = blame.get(rid, 0.0) + overlap * n / total
            if with_target:
                shared[rid] = shared.get(rid, 0) + 1
    return blame, shared


def _blame_by_sweep(others: list[Occupancy], from_ns: int, to_ns: int) -> dict[str, float]:
    """Each moment of the window split evenly among the neighbours holding the engine."""
    edges: list[tuple[int, int, str]] = []
    for o in others:
        for phase, start, end in o.phases:
            start, end = max(start, from_ns), min(end, to_ns)
            if phase in BUSY_PHASES and end > start:
                edges.append((start, 1, o.request_id))
                edges.append((end, -1, o.request_id))
    edges.sort(key=lambda e: (e[0], e[1]))      # ends before starts at the same instant
    blame: dict[str, float] = {}
    holding: dict[str, int] = {}
    last = from_ns
    for t, delta, rid in edges:
        if holding and t > last:
            share = (t - last) / len(holding)
            for held in holding:
                blame[held] = blame.get(held, 0.0) + share
        last = t
        count = holding.get(rid, 0) + delta
        if count > 0:
            holding[rid] = count
        else:
            holding.pop(rid, None)
    return blame


def culprits(found: list[Neighbour], window_ns: int, *, share_wanted: float = 0.5,
             most: int = 3) -> list[dict]:
    """The fewest neighbours (at most `most`) whose blame covers `share_wanted` of all the
    blame, as evidence: trace id, blame and its share of the window, phase and tokens."""
    total = sum(n.blame_ns for n in found)
    out, covered = [], 0
    for n in found:
        if n.blame_ns <= 0 or len(out) == most or (out and covered >= share_wanted * total):
            break
        covered += n.blame_ns
        o = n.occupancy
        out.append({"trace_id": o.trace_id, "blame_ms": round(n.blame_ns / _MS, 1),
                    "share": round(n.blame_ns / window_ns, 2) if window_ns > 0 else None,
                    "phase": n.phase, "prompt_tokens": o.num_prompt_tokens,
                    "cached_tokens": o.num_cached_tokens})
    return out
