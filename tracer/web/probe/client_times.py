"""The beacon's `t`: the browser's timestamps of one request, on one monotonic clock, with
the rules that keep them in order (a broken one is a 422 naming the later field)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from tracer.record.output_segments import by_arrival
from tracer.web.probe.beacon_error import rule_broken
from tracer.web.probe.beacon_fields import Milestone, Ms, StartMs

_T_FIELDS = ("start", "headers", "first_byte", "first_token", "first_paint", "end",
             "first_reasoning", "first_tool_call")


class ClientTimes(BaseModel):
    """Browser timestamps in ms since the probe's fetch() call (`start` is 0). One monotonic
    clock: start <= headers <= first_byte <= first_token <= first_paint, all <= end, and
    first_reasoning and first_tool_call lie between the first byte and end."""

    model_config = ConfigDict(frozen=True)

    start: StartMs
    headers: Milestone | None = None
    first_byte: Milestone | None = None
    first_token: Milestone | None = None
    first_paint: Milestone | None = None
    end: Ms
    # the first reasoning text (thinking), kept apart from first_token: it does not end TTFT
    first_reasoning: Milestone | None = None
    # the first event naming a tool call's function: with first_token and first_reasoning,
    # the first output of any kind (`first_output`)
    first_tool_call: Milestone | None = None

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in _T_FIELDS}

    def after_first_byte(self, ms: float) -> bool:
        """Whether `ms` lies between the response's first byte (or headers) and the end."""
        return max(self.headers or 0.0, self.first_byte or 0.0) <= ms <= self.end

    def first_output(self) -> tuple[float | None, str | None]:
        """(ms, kind) of the first output of any kind: "text" (first_token), "tool_call" or
        "reasoning", by the server's rule, ties included (tracer/record/output_segments.py,
        `by_arrival`). (None, None) without any output.

        >>> ClientTimes(start=0, first_token=9, first_tool_call=4, end=10).first_output()
        (4.0, 'tool_call')
        """
        times = by_arrival({"text": self.first_token, "tool_call": self.first_tool_call,
                            "reasoning": self.first_reasoning})
        return (times[0][0], times[0][2]) if times else (None, None)

    @model_validator(mode="after")
    def _one_clock(self) -> ClientTimes:
        order = [n for n in ("start", "headers", "first_byte", "first_token")
                 if getattr(self, n) is not None]
        for before, after in zip(order, order[1:]):
            if getattr(self, after) < getattr(self, before):
                raise rule_broken(f"t.{after}", f"t.{after} is earlier than t.{before}")
        if self.end < getattr(self, order[-1]):
            raise rule_broken("t.end", "t.end is earlier than the stream's milestones")
        for name in ("first_reasoning", "first_tool_call"):
            at = getattr(self, name)
            if at is not None and not self.after_first_byte(at):
                raise rule_broken(f"t.{name}", f"t.{name} must lie between the "
                                  "response's first byte and t.end")
        if self.first_paint is not None and (self.first_token is None
                                             or self.first_paint < self.first_token):
            raise rule_broken("t.first_paint", "t.first_paint needs an earlier t.first_token")
        return self
