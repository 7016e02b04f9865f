"""What a cause rule answers (`Outcome`): a `Finding` (its cause and the excess over normal
it measured), an `Unjudged` (the rule applies but its baseline is too short to say), or None.

Apart from the rules (tracer/record/cause_rules.py) because more than the verdict reads and
writes these: the neighbours' rule (tracer/record/behind_neighbours.py), the collector's path
verdict and the store's codec, none of which needs the rules themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tracer.record.baselines import MIN_SAMPLES


@dataclass(slots=True, frozen=True)
class Finding:
    cause: str
    excess_ns: int | None                   # None: no baseline to measure it against yet
    evidence: dict = field(default_factory=dict)
    behind_long_prefill: bool = False       # its culprit is a long prompt's prefill


@dataclass(slots=True, frozen=True)
class Unjudged:
    """A rule that applies to the record but could not judge it: the series it compares
    with holds `samples` values, fewer than `MIN_SAMPLES`."""

    cause: str
    samples: int

    def __post_init__(self) -> None:
        assert self.samples < MIN_SAMPLES, self


# What a rule answers: a finding, a request it could not judge, or nothing to say.
Outcome = Finding | Unjudged | None
