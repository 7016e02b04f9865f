"""One probe beacon, as the server reads it (frontend_probe/probe.js header, README).

A beacon comes from any browser, so it is hostile input: every field is type-checked
(`tracer/web/probe/beacon_fields.py`), and unknown fields are dropped. What survives is a
frozen `Beacon` built only from checked values; nothing of the raw body is ever kept.

`Beacon` is a pydantic model: the one statement of the schema, which both validates and
writes the JSON Schema that /openapi.json shows (`tracer/web/probe/schema.py`), so the
document cannot drift from the check.

>>> Beacon.model_validate({"v": 1, "outcome": "ok", "t": {"start": 0, "end": 9},
...                        "chunks": 2, "chunk_ms": [3, 5]}).as_dict()["chunk_ms"]
[3.0, 5.0]
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from typing_extensions import NotRequired, TypedDict

from tracer.record.first_content import FORMATS
from tracer.web.probe.beacon_error import rule_broken
from tracer.web.probe.beacon_fields import (
    MAX_CHUNK_TIMES,
    MAX_TOOL_CALLS,
    OUTCOMES,
    BeaconToken,
    Count,
    HttpStatus,
    Milestone,
    ModelName,
    Ms,
    Sdk,
    ServerToken,
    ToolName,
    Traceparent,
    TraceId,
    UrlPath,
    Version,
)
from tracer.web.probe.client_times import ClientTimes


class ItlStats(TypedDict):
    """The client's inter-token latencies over the stream, in ms."""

    mean: Ms
    p50: Ms
    p95: Ms
    max: Ms
    count: NotRequired[Count]


class ResourceTimes(TypedDict):
    """The Resource Timing phases of the request, in ms."""

    dns_ms: Ms
    connect_ms: Ms
    tls_ms: Ms
    request_ms: Ms
    response_ms: Ms


class ToolCall(BaseModel):
    """One tool call of the stream: its function's name, when the event naming it arrived,
    when its arguments were complete (None: never, the stream ended first). Never its
    arguments."""

    model_config = ConfigDict(frozen=True)

    name: ToolName | None = None
    start: Milestone
    ready: Milestone | None = None

    @model_validator(mode="after")
    def _ready_after_start(self) -> ToolCall:
        if self.ready is not None and self.ready < self.start:
            raise rule_broken("tool_calls", "a tool call's ready must not be before its start")
        return self

    def as_dict(self) -> dict:
        return {"name": self.name, "start": self.start, "ready": self.ready}


def _counted(stats: dict) -> dict:
    return {"count": stats.get("count", 0), **{k: v for k, v in stats.items() if k != "count"}}


_OBJECT_OR_NULL = "an object or null"
_TOOL_CALLS_RULE = (f"a list of at most {MAX_TOOL_CALLS} tool calls {{name, start, ready}}, "
                    "in start order, within t")


# A model's docstring is its description in the JSON Schema: doctests go in the module's.
class Beacon(BaseModel):
    """One probe beacon (frontend_probe/README.md, field by field). Unknown fields are
    dropped. Rules between fields are 422s too: the times of `t` never go backwards,
    `first_paint` needs `first_token`, `chunk_ms` holds at most `chunks` non-decreasing
    times."""

    model_config = ConfigDict(frozen=True)

    # Fields run in this order, and the first broken one is the one a 422 names.
    v: Version
    # null is valid (README: a malformed caller traceparent and no Server-Timing): unjoinable.
    trace_id: TraceId | None = Field(
        None, description="32 lowercase hex digits (not all zero) or null")
    outcome: Literal[OUTCOMES] = Field(description=f"one of {', '.join(OUTCOMES)}")
    chunks: Count = 0
    t: ClientTimes = Field(description="an object of client timestamps")
    traceparent: Traceparent | None = None
    status: HttpStatus | None = Field(None, description="an HTTP status code or null")
    url_path: UrlPath | None = None
    itl_ms: Annotated[ItlStats, AfterValidator(_counted)] | None = Field(
        None, description=_OBJECT_OR_NULL)
    resource: ResourceTimes | None = Field(None, description=_OBJECT_OR_NULL)
    probe_errors: Count = 0
    sdk: Sdk | None = None
    model: ModelName | None = None
    input_ms: Ms | None = None            # markInput() → fetch(), when the page marked it
    # arrival of the first content chunks, like t.*
    chunk_ms: Annotated[tuple[Ms, ...], Field(max_length=MAX_CHUNK_TIMES)] | None = Field(
        (), description=f"a list of at most {MAX_CHUNK_TIMES} times, no more than chunks")
    # The server's beacon token from Server-Timing; checked by ingest, never stored.
    token: BeaconToken | None = None
    # The server's signed in-band timing (`: ttft-timing <token>`); checked by ingest.
    server: ServerToken | None = Field(
        None, description="the `: ttft-timing` token, <base64url>.<base64url>")
    # The stream's format (the closed set FORMATS, tracer/record/first_content.py); None when
    # the probe recognised none, or an older probe did not say.
    format: Literal[FORMATS] | None = Field(
        None, description=f"one of {', '.join(FORMATS)} or null")
    # The stream's first tool calls, in start order (frontend_probe/formats.js).
    tool_calls: Annotated[tuple[ToolCall, ...], Field(max_length=MAX_TOOL_CALLS)] | None = Field(
        (), description=_TOOL_CALLS_RULE)

    @field_validator("chunk_ms", mode="before")
    @classmethod
    def _no_more_times_than_chunks(cls, value: object, info: ValidationInfo) -> object:
        # Before the times themselves: a list too long is refused as a whole.
        if isinstance(value, list) and len(value) > info.data.get("chunks", 0):
            raise rule_broken("chunk_ms", f"chunk_ms must be a list of at most "
                              f"{MAX_CHUNK_TIMES} times, no more than chunks")
        return value

    @field_validator("chunk_ms")
    @classmethod
    def _arrival_order(cls, times: tuple[float, ...] | None) -> tuple[float, ...]:
        if times is None:
            return ()
        if any(b < a for a, b in zip(times, times[1:])):
            raise rule_broken("chunk_ms", "chunk_ms must not decrease")
        return times

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _not_too_many_calls(cls, value: object) -> object:
        # Before the calls themselves: a list too long is refused as a whole, unread.
        if isinstance(value, list) and len(value) > MAX_TOOL_CALLS:
            raise rule_broken("tool_calls", f"tool_calls must be {_TOOL_CALLS_RULE}")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _calls_within_the_stream(cls, calls: tuple[ToolCall, ...] | None,
                                 info: ValidationInfo) -> tuple[ToolCall, ...]:
        if calls is None:
            return ()
        t = info.data.get("t")
        if any(b.start < a.start for a, b in zip(calls, calls[1:])):
            raise rule_broken("tool_calls", "tool_calls must be in start order")
        if t is not None and not all(t.after_first_byte(c.start)
                                     and (c.ready is None or c.ready <= t.end) for c in calls):
            raise rule_broken("tool_calls", "tool_calls must lie between the response's "
                              "first byte and t.end")
        return calls

    def as_dict(self) -> dict:
        """A plain, JSON-safe copy (fresh containers: callers may keep it)."""
        return {"trace_id": self.trace_id, "outcome": self.outcome, "t": self.t.as_dict(),
                "traceparent": self.traceparent, "status": self.status,
                "url_path": self.url_path, "chunks": self.chunks,
                "itl_ms": None if self.itl_ms is None else dict(self.itl_ms),
                "resource": None if self.resource is None else dict(self.resource),
                "probe_errors": self.probe_errors, "sdk": self.sdk, "model": self.model,
                "input_ms": self.input_ms, "chunk_ms": list(self.chunk_ms),
                "format": self.format, "tool_calls": [c.as_dict() for c in self.tool_calls]}
