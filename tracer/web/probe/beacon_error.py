"""How a beacon is refused: `BeaconError`, the 400 or 422 its sender is answered with, and
`rule_broken`, a rule between fields broken inside validation.

A rule between fields (times that go backwards, more chunk times than chunks) is no single
field's type, so it cannot be described by a field's rule: it carries its own message and
the param to name, under the error type `RULE_ERROR`, which `tracer/web/probe/schema.py`
turns into the 422 as it is.

>>> error = rule_broken("t.end", "t.end is earlier than the stream's milestones")
>>> error.type == RULE_ERROR, error.context["param"]
(True, 't.end')
"""
from __future__ import annotations

from pydantic_core import PydanticCustomError

RULE_ERROR = "beacon_rule"   # a rule between fields: its own message and param


class BeaconError(ValueError):
    """A rejected beacon: `status` is 400 (not JSON) or 422 (JSON, wrong shape)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def rule_broken(param: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(RULE_ERROR, message, {"param": param})
