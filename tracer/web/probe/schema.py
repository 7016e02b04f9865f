"""The probe beacon's schema (frontend_probe/probe.js header, README): parse, check, bound.

A beacon comes from any browser, so it is hostile input: every field is type-checked,
numbers must be finite and within sane bounds, strings are length- and charset-bounded,
and unknown fields are dropped. What survives is a frozen `Beacon` built only from checked
values; nothing of the raw body is ever kept.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from tracer.record.first_content import FORMATS
from tracer.record.traceparent import is_trace_id, parse_traceparent

OUTCOMES = ("ok", "http_error", "aborted", "network_error")
SCHEMA_VERSION = 1
# A day in ms: longer than any chat stream, short enough to keep sums and spans sane.
MAX_MS = 86_400_000.0
# No browser waits an hour for a first token: a later milestone is a lie, not a measurement,
# and one such beacon would move a histogram's sum by hours (issue: "86,399,992 ms").
MAX_MILESTONE_MS = 3_600_000.0
_MILESTONES = ("headers", "first_byte", "first_token", "first_paint")
MAX_COUNT = 10_000_000
# The probe reports the arrival of the first this-many content chunks (`chunk_ms`): enough
# for the client ITL of a chat answer's opening, bounded so a beacon stays ~1 KB.
MAX_CHUNK_TIMES = 32
_URL_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,255}")
_SDK = re.compile(r"[A-Za-z0-9._@/+ -]{1,64}")
_MODEL = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
_ANY = re.compile(r".*", re.DOTALL)
_TOKEN = re.compile(r"[0-9a-f]{64}")   # tracer/web/probe/token.py
# The in-band timing token (tracer/web/inband.py): <base64url payload>.<base64url HMAC>.
_SERVER_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,2000}\.[A-Za-z0-9_-]{43}")
MAX_SERVER_TOKEN_CHARS = 2048
_T_FIELDS = ("start", "headers", "first_byte", "first_token", "first_paint", "end",
             "first_reasoning")
_ITL_FIELDS = ("count", "mean", "p50", "p95", "max")
_RESOURCE_FIELDS = ("dns_ms", "connect_ms", "tls_ms", "request_ms", "response_ms")


class BeaconError(ValueError):
    """A rejected beacon: `status` is 400 (not JSON) or 422 (JSON, wrong shape)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(slots=True, frozen=True)
class ClientTimes:
    """Browser timestamps in ms since the probe's fetch() call (`start` is 0)."""

    start: float
    headers: float | None
    first_byte: float | None
    first_token: float | None
    first_paint: float | None
    end: float
    # the first reasoning text (thinking), kept apart from first_token: it does not end TTFT
    first_reasoning: float | None = None

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in _T_FIELDS}


@dataclass(slots=True, frozen=True)
class Beacon:
    """One checked probe beacon.

    >>> b = parse_beacon(b'{"v":1,"trace_id":"' + b"ab" * 16 + b'","outcome":"ok",'
    ...     b'"t":{"start":0,"headers":40,"first_byte":41,"first_token":55,"end":90},"junk":1}')
    >>> b.trace_id == "ab" * 16, b.t.first_token, b.chunks
    (True, 55.0, 0)
    """

    trace_id: str | None
    outcome: str
    t: ClientTimes
    traceparent: str | None = None
    status: int | None = None
    url_path: str | None = None
    chunks: int = 0
    itl_ms: dict | None = None
    resource: dict | None = None
    probe_errors: int = 0
    sdk: str | None = None
    model: str | None = None
    input_ms: float | None = None            # markInput() → fetch(), when the page marked it
    chunk_ms: tuple[float, ...] = ()         # arrival of the first content chunks, like t.*
    # The server's beacon token from Server-Timing; checked by ingest, never stored.
    token: str | None = None
    # The server's signed in-band timing (`: ttft-timing <token>`); checked by ingest.
    server: str | None = None
    # The stream's format (the closed set FORMATS, tracer/record/first_content.py); None when
    # the probe recognised none, or an older probe did not say.
    format: str | None = None

    def as_dict(self) -> dict:
        """A plain, JSON-safe copy (fresh containers: callers may keep it)."""
        return {"trace_id": self.trace_id, "outcome": self.outcome, "t": self.t.as_dict(),
                "traceparent": self.traceparent, "status": self.status,
                "url_path": self.url_path, "chunks": self.chunks,
                "itl_ms": None if self.itl_ms is None else dict(self.itl_ms),
                "resource": None if self.resource is None else dict(self.resource),
                "probe_errors": self.probe_errors, "sdk": self.sdk, "model": self.model,
                "input_ms": self.input_ms, "chunk_ms": list(self.chunk_ms),
                "format": self.format}


def _reject_constant(name: str):
    # json.loads accepts NaN/Infinity by default; they are not JSON and not finite.
    raise BeaconError(422, f"numbers must be finite, got {name}")


def parse_beacon(body: bytes) -> Beacon:
    """The checked beacon in `body`, or BeaconError(400 | 422)."""
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
    if obj.get("v") != SCHEMA_VERSION or isinstance(obj.get("v"), bool):
        raise BeaconError(422, f"unsupported beacon version; expected v={SCHEMA_VERSION}", "v")
    trace_id = obj.get("trace_id")
    # null is valid (README: a malformed caller traceparent and no Server-Timing): unjoinable.
    if trace_id is not None and (not isinstance(trace_id, str) or trace_id == "0" * 32
                                 or not is_trace_id(trace_id)):
        raise BeaconError(422, "trace_id must be 32 lowercase hex digits (not all zero) or "
                          "null", "trace_id")
    outcome = obj.get("outcome")
    if outcome not in OUTCOMES:
        raise BeaconError(422, f"outcome must be one of {', '.join(OUTCOMES)}", "outcome")
    chunks = _count(obj, "chunks")
    return Beacon(
        trace_id=trace_id, outcome=outcome, t=_times(obj.get("t")),
        traceparent=_traceparent(obj),
        status=_status(obj.get("status")),
        url_path=_safe_str(obj, "url_path", _URL_PATH, 2048),
        chunks=chunks, itl_ms=_itl(obj.get("itl_ms")),
        resource=_numbers(obj.get("resource"), _RESOURCE_FIELDS, "resource"),
        probe_errors=_count(obj, "probe_errors"),
        sdk=_safe_str(obj, "sdk", _SDK, 256), model=_safe_str(obj, "model", _MODEL, 256),
        input_ms=_ms(obj.get("input_ms"), "input_ms"),
        chunk_ms=_chunk_times(obj.get("chunk_ms"), chunks),
        token=_safe_str(obj, "token", _TOKEN, 128), server=_server_token(obj),
        format=_format(obj.get("format")))


def _ms(value: object, param: str, *, required: bool = False) -> float | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BeaconError(422, f"{param} must be a number of ms", param)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float's range, e.g. 10**400
        value = math.inf
    if not math.isfinite(value) or not 0.0 <= value <= MAX_MS:
        raise BeaconError(422, f"{param} must be finite and within [0, {MAX_MS:.0f}] ms", param)
    return value


def _times(t: object) -> ClientTimes:
    if not isinstance(t, dict):
        raise BeaconError(422, "t must be an object of client timestamps", "t")
    vals = {name: _ms(t.get(name), f"t.{name}", required=name in ("start", "end"))
            for name in _T_FIELDS}
    if vals["start"] != 0.0:
        raise BeaconError(422, "t.start must be 0 (times are relative to fetch())", "t.start")
    for name in (*_MILESTONES, "first_reasoning"):
        if vals[name] is not None and vals[name] > MAX_MILESTONE_MS:
            raise BeaconError(422, f"t.{name} is implausible: more than "
                              f"{MAX_MILESTONE_MS:.0f} ms after fetch()", f"t.{name}")
    # One monotonic browser clock: the stream's milestones cannot go backwards.
    order = [n for n in ("start", "headers", "first_byte", "first_token") if vals[n] is not None]
    for before, after in zip(order, order[1:]):
        if vals[after] < vals[before]:
            raise BeaconError(422, f"t.{after} is earlier than t.{before}", f"t.{after}")
    if vals["end"] < vals[order[-1]]:
        raise BeaconError(422, "t.end is earlier than the stream's milestones", "t.end")
    reasoning = vals["first_reasoning"]
    if reasoning is not None and not (max(vals[n] or 0.0 for n in ("headers", "first_byte"))
                                      <= reasoning <= vals["end"]):
        raise BeaconError(422, "t.first_reasoning must lie between the response's first byte "
                          "and t.end", "t.first_reasoning")
    if vals["first_paint"] is not None and (vals["first_token"] is None
                                            or vals["first_paint"] < vals["first_token"]):
        raise BeaconError(422, "t.first_paint needs an earlier t.first_token", "t.first_paint")
    return ClientTimes(**vals)


def _safe_str(obj: dict, name: str, pattern: re.Pattern, max_chars: int) -> str | None:
    """The string if it fits `pattern`, None if it does not (a caller-provided traceparent or
    an odd URL path is the page's business, not a reason to lose the timings); 422 when it is
    not a string or longer than `max_chars`."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        raise BeaconError(422, f"{name} must be a string of at most {max_chars} characters",
                          name)
    return value if pattern.fullmatch(value) else None


def _server_token(obj: dict) -> str | None:
    """The in-band timing token: a string of two base64url parts, else 422 (unlike a page's
    odd URL path, a malformed one is not the page's business: the probe copies it verbatim)."""
    value = obj.get("server")
    if value is None:
        return None
    if (not isinstance(value, str) or len(value) > MAX_SERVER_TOKEN_CHARS
            or not _SERVER_TOKEN.fullmatch(value)):
        raise BeaconError(422, "server must be the `: ttft-timing` token, "
                          "<base64url>.<base64url>", "server")
    return value


def _format(value: object) -> str | None:
    """The stream format: one of the closed set, or null (unknown to the probe); anything
    else is 422, so no free-form string ever reaches a label or a stored record."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in FORMATS:
        raise BeaconError(422, f"format must be one of {', '.join(FORMATS)} or null", "format")
    return value


def _traceparent(obj: dict) -> str | None:
    """The W3C traceparent the probe sent, normalised; None when the page's own was invalid."""
    parsed = parse_traceparent(_safe_str(obj, "traceparent", _ANY, 256))
    return None if parsed is None else str(parsed)


def _status(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
        raise BeaconError(422, "status must be an HTTP status code or null", "status")
    return value


def _count(obj: dict, name: str, param: str | None = None) -> int:
    value = obj.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        param = param or name
        raise BeaconError(422, f"{param} must be an integer in [0, {MAX_COUNT}]", param)
    return value


def _numbers(value: object, fields: tuple[str, ...], param: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BeaconError(422, f"{param} must be an object or null", param)
    return {name: _ms(value.get(name), f"{param}.{name}", required=True) for name in fields}


def _itl(value: object) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BeaconError(422, "itl_ms must be an object or null", "itl_ms")
    stats = _numbers({k: v for k, v in value.items() if k != "count"}, _ITL_FIELDS[1:], "itl_ms")
    return {"count": _count(value, "count", "itl_ms.count"), **stats}


def _chunk_times(value: object, chunks: int) -> tuple[float, ...]:
    """At most `MAX_CHUNK_TIMES` arrival times, one per content chunk counted in `chunks`, in
    the order they arrived (one monotonic clock: never decreasing)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > min(MAX_CHUNK_TIMES, chunks):
        raise BeaconError(422, f"chunk_ms must be a list of at most {MAX_CHUNK_TIMES} times, "
                          "no more than chunks", "chunk_ms")
    times = tuple(_ms(v, f"chunk_ms[{i}]", required=True) for i, v in enumerate(value))
    if any(b < a for a, b in zip(times, times[1:])):
        raise BeaconError(422, "chunk_ms must not decrease", "chunk_ms")
    return times
