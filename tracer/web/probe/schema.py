"""The probe beacon's schema (frontend_probe/probe.js header, README): parse, check, bound.

A beacon comes from any browser, so it is hostile input: every field is type-checked,
numbers must be finite and within sane bounds, strings are length- and charset-bounded,
and unknown fields are dropped. What survives is a frozen `Beacon` built only from checked
values; nothing of the raw body is ever kept.

`Beacon` is a pydantic model: the one statement of the schema, which both validates and
writes the JSON Schema that /openapi.json shows (`beacon_json_schema`), so the document
cannot drift from the check. Each field's `description` is also its rule in the 422's
message (`<param> must be <description>`).
"""
from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import NotRequired, TypedDict

from tracer.record.emits import MAX_SEND_TIMES
from tracer.record.first_content import FORMATS
from tracer.record.output_segments import by_arrival
from tracer.record.traceparent import parse_traceparent
from tracer.web.probe.schema_nodes import inlined, node_at

OUTCOMES = ("ok", "http_error", "aborted", "network_error")
SCHEMA_VERSION = 1
# A day in ms: longer than any chat stream, short enough to keep sums and spans sane.
MAX_MS = 86_400_000.0
# No browser waits an hour for a first token: a later milestone is a lie, not a measurement,
# and one such beacon would move a histogram's sum by hours (issue: "86,399,992 ms").
MAX_MILESTONE_MS = 3_600_000.0
MAX_COUNT = 10_000_000
# The probe reports the arrival of the first this-many content chunks (`chunk_ms`): the
# server's send times are bounded by the same number, so the two pair one to one.
MAX_CHUNK_TIMES = MAX_SEND_TIMES
MAX_SERVER_TOKEN_CHARS = 2048
# The probe lists the first this-many tool calls of a stream, each function name cut to this
# many characters (frontend_probe/formats.js, MAX_CALLS): never arguments.
MAX_TOOL_CALLS = 8
MAX_TOOL_NAME_CHARS = 64
_ZERO_TRACE_ID = "0" * 32   # W3C Trace Context: an all-zero trace id is invalid
_URL_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,255}")
_SDK = re.compile(r"[A-Za-z0-9._@/+ -]{1,64}")
_MODEL = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
_TOKEN = re.compile(r"[0-9a-f]{64}")   # tracer/web/probe/token.py
# A function name as the APIs allow them (OpenAI and Anthropic: [a-zA-Z0-9_-]{1,64}; Gemini
# adds '.' and ':'); any other name is kept as None, its times still count.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:/@+-]{1,64}")
_T_FIELDS = ("start", "headers", "first_byte", "first_token", "first_paint", "end",
             "first_reasoning", "first_tool_call")
_RULE_ERROR = "beacon_rule"   # a rule between fields: its own message and param


class BeaconError(ValueError):
    """A rejected beacon: `status` is 400 (not JSON) or 422 (JSON, wrong shape)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def _rule_broken(param: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(_RULE_ERROR, message, {"param": param})


def _ms(max_ms: float, rule: str | None = None):
    """A number of ms in [0, max_ms]; `strict` refuses booleans and numeric strings."""
    return Annotated[float, Field(strict=True, ge=0, le=max_ms, allow_inf_nan=False,
                                  description=rule or f"finite and within [0, {max_ms:.0f}] ms")]


def _bounded_string(max_chars: int):
    return Annotated[str, Field(strict=True, max_length=max_chars,
                                description=f"a string of at most {max_chars} characters")]


def _page_string(max_chars: int, pattern: re.Pattern):
    """A string the page chose: longer than `max_chars` is a 422, one off `pattern` becomes
    None (a caller's odd URL path is the page's business, not a reason to lose the timings)."""
    return Annotated[_bounded_string(max_chars),
                     AfterValidator(lambda text: text if pattern.fullmatch(text) else None)]


def _normalised_traceparent(text: str) -> str | None:
    """The W3C traceparent the probe sent, normalised; None when the page's own was invalid."""
    parsed = parse_traceparent(text)
    return None if parsed is None else str(parsed)


def _refuse_bool(value: object) -> object:
    # JSON's true is not the version 1, though Python's True == 1.
    if isinstance(value, bool):
        raise ValueError("a boolean")
    return value


def _refuse_zero_trace_id(trace_id: str) -> str:
    if trace_id == _ZERO_TRACE_ID:
        raise ValueError("all zero")
    return trace_id


Ms = _ms(MAX_MS)
Milestone = _ms(MAX_MILESTONE_MS, f"finite and within [0, {MAX_MILESTONE_MS:.0f}] ms: a later "
                                  "milestone is implausible")
StartMs = _ms(0.0, "0 (times are relative to fetch())")
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT,
                             description=f"an integer in [0, {MAX_COUNT}]")]
Version = Annotated[Literal[SCHEMA_VERSION], BeforeValidator(_refuse_bool),
                    Field(description=f"{SCHEMA_VERSION}, the beacon version this server reads")]
TraceId = Annotated[str, Field(strict=True, pattern="^[0-9a-f]{32}$",
                               json_schema_extra={"not": {"const": _ZERO_TRACE_ID}}),
                    AfterValidator(_refuse_zero_trace_id)]
Traceparent = Annotated[_bounded_string(256), AfterValidator(_normalised_traceparent)]
# The in-band timing token (tracer/web/inband.py), `<base64url payload>.<base64url HMAC>`,
# copied verbatim by the probe: a malformed one is a 422, not the page's business.
ServerToken = Annotated[str, Field(strict=True, max_length=MAX_SERVER_TOKEN_CHARS,
                                   pattern=r"^[A-Za-z0-9_-]{1,2000}\.[A-Za-z0-9_-]{43}$")]


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
                raise _rule_broken(f"t.{after}", f"t.{after} is earlier than t.{before}")
        if self.end < getattr(self, order[-1]):
            raise _rule_broken("t.end", "t.end is earlier than the stream's milestones")
        for name in ("first_reasoning", "first_tool_call"):
            at = getattr(self, name)
            if at is not None and not self.after_first_byte(at):
                raise _rule_broken(f"t.{name}", f"t.{name} must lie between the "
                                   "response's first byte and t.end")
        if self.first_paint is not None and (self.first_token is None
                                             or self.first_paint < self.first_token):
            raise _rule_broken("t.first_paint", "t.first_paint needs an earlier t.first_token")
        return self


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

    name: _page_string(MAX_TOOL_NAME_CHARS, _TOOL_NAME) | None = None
    start: Milestone
    ready: Milestone | None = None

    @model_validator(mode="after")
    def _ready_after_start(self) -> ToolCall:
        if self.ready is not None and self.ready < self.start:
            raise _rule_broken("tool_calls", "a tool call's ready must not be before its start")
        return self

    def as_dict(self) -> dict:
        return {"name": self.name, "start": self.start, "ready": self.ready}


def _counted(stats: dict) -> dict:
    return {"count": stats.get("count", 0), **{k: v for k, v in stats.items() if k != "count"}}


_OBJECT_OR_NULL = "an object or null"
_TOOL_CALLS_RULE = (f"a list of at most {MAX_TOOL_CALLS} tool calls {{name, start, ready}}, "
                    "in start order, within t")


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
    status: Annotated[int, Field(strict=True, ge=100, le=599)] | None = Field(
        None, description="an HTTP status code or null")
    url_path: _page_string(2048, _URL_PATH) | None = None
    itl_ms: Annotated[ItlStats, AfterValidator(_counted)] | None = Field(
        None, description=_OBJECT_OR_NULL)
    resource: ResourceTimes | None = Field(None, description=_OBJECT_OR_NULL)
    probe_errors: Count = 0
    sdk: _page_string(256, _SDK) | None = None
    model: _page_string(256, _MODEL) | None = None
    input_ms: Ms | None = None            # markInput() → fetch(), when the page marked it
    # arrival of the first content chunks, like t.*
    chunk_ms: Annotated[tuple[Ms, ...], Field(max_length=MAX_CHUNK_TIMES)] | None = Field(
        (), description=f"a list of at most {MAX_CHUNK_TIMES} times, no more than chunks")
    # The server's beacon token from Server-Timing; checked by ingest, never stored.
    token: _page_string(128, _TOKEN) | None = None
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
            raise _rule_broken("chunk_ms", f"chunk_ms must be a list of at most "
                               f"{MAX_CHUNK_TIMES} times, no more than chunks")
        return value

    @field_validator("chunk_ms")
    @classmethod
    def _arrival_order(cls, times: tuple[float, ...] | None) -> tuple[float, ...]:
        if times is None:
            return ()
        if any(b < a for a, b in zip(times, times[1:])):
            raise _rule_broken("chunk_ms", "chunk_ms must not decrease")
        return times

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _not_too_many_calls(cls, value: object) -> object:
        # Before the calls themselves: a list too long is refused as a whole, unread.
        if isinstance(value, list) and len(value) > MAX_TOOL_CALLS:
            raise _rule_broken("tool_calls", f"tool_calls must be {_TOOL_CALLS_RULE}")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _calls_within_the_stream(cls, calls: tuple[ToolCall, ...] | None,
                                 info: ValidationInfo) -> tuple[ToolCall, ...]:
        if calls is None:
            return ()
        t = info.data.get("t")
        if any(b.start < a.start for a, b in zip(calls, calls[1:])):
            raise _rule_broken("tool_calls", "tool_calls must be in start order")
        if t is not None and not all(t.after_first_byte(c.start)
                                     and (c.ready is None or c.ready <= t.end) for c in calls):
            raise _rule_broken("tool_calls", "tool_calls must lie between the response's "
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


_SCHEMA = Beacon.model_json_schema()


def _reject_constant(name: str):
    # json.loads accepts NaN/Infinity by default; they are not JSON and not finite.
    raise BeaconError(422, f"numbers must be finite, got {name}")


def parse_beacon(body: bytes) -> Beacon:
    """The checked beacon in `body`, or BeaconError(400 | 422).

    >>> b = parse_beacon(b'{"v":1,"trace_id":"' + b"ab" * 16 + b'","outcome":"ok",'
    ...     b'"t":{"start":0,"headers":40,"first_byte":41,"first_token":55,"end":90},"junk":1}')
    >>> b.trace_id == "ab" * 16, b.t.first_token, b.chunks
    (True, 55.0, 0)
    >>> try:
    ...     parse_beacon(b'{"v":1,"outcome":"ok","t":{"start":0,"headers":-1,"end":9}}')
    ... except BeaconError as exc:
    ...     print(exc.status, exc.param, exc.message)
    422 t.headers t.headers must be finite and within [0, 3600000] ms: a later milestone is implausible
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BeaconError(400, "beacon body is not UTF-8") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, RecursionError):
        raise BeaconError(400, "beacon body is not valid JSON") from None
    except BeaconError:  # NaN / Infinity, refused by _reject_constant
        raise
    except ValueError:  # an integer past Python's int_max_str_digits (4300 by default)
        raise BeaconError(400, "beacon body has a number with too many digits") from None
    if not isinstance(obj, dict):
        raise BeaconError(422, "a beacon is a JSON object")
    try:
        return Beacon.model_validate(obj)
    except ValidationError as exc:
        raise _refusal(exc.errors(include_url=False, include_input=False)[0]) from None


def _refusal(error: dict) -> BeaconError:
    """The 422 for pydantic's first error: the field it names, and that field's rule."""
    if error["type"] == _RULE_ERROR:
        return BeaconError(422, error["msg"], error["ctx"]["param"])
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                    for part in error["loc"]).lstrip(".")
    node = node_at(_SCHEMA, error["loc"])
    if node.get("type") == "number" and error["type"] in ("float_type", "missing"):
        return BeaconError(422, f"{param} must be a number of ms", param)
    return BeaconError(422, f"{param} must be {node.get('description', 'valid')}", param)


def beacon_json_schema() -> dict:
    """The beacon's JSON Schema, self-contained (definitions inlined, no titles), for an
    OpenAPI request body where `#/$defs/...` would not resolve.

    >>> schema = beacon_json_schema()
    >>> schema["required"], schema["properties"]["t"]["properties"]["start"]["maximum"]
    (['v', 'outcome', 't'], 0.0)
    """
    return inlined(_SCHEMA)
