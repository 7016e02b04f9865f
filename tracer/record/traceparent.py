"""W3C Trace Context: parse and make `traceparent`, and carry it in `Server-Timing`.

`traceparent: 00-<32 lowercase hex trace-id>-<16 lowercase hex parent-id>-<2 hex flags>`;
all-zero ids and version `ff` are invalid (W3C Trace Context §3.2). The server returns its
own context as `Server-Timing: trace;desc=<traceparent>` (the Trace Context response draft
that replaced `traceresponse`); a traceparent is a Server-Timing token, so it is unquoted.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tracer.record.ids import ID_RNG

_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
_SAMPLED = 0x01
_TRACEPARENT_LEN = 55
# Seeded from the OS and re-seeded in a forked child; no system call per id (tracer/record/ids.py).
_DEFAULT_RNG = ID_RNG


@dataclass(slots=True, frozen=True)
class TraceParent:
    """A valid, parsed traceparent.

    >>> tp = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    >>> tp.trace_id, tp.span_id, tp.sampled
    ('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7', True)
    """

    trace_id: str
    span_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _SAMPLED)

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and _HEX.issuperset(text)


def is_trace_id(text: object) -> bool:
    """A valid W3C trace id: 32 lowercase hex digits, not all zero.

    >>> is_trace_id("4bf92f3577b34da6a3ce929d0e0e4736"), is_trace_id("0" * 32), is_trace_id("4BF9" * 8)
    (True, False, False)
    """
    return isinstance(text, str) and _is_hex(text, 32) and text != _ZERO_TRACE_ID


def parse_traceparent(header: str | None) -> TraceParent | None:
    """The parsed header, or None when it is absent or invalid (never raises)."""
    if not isinstance(header, str):
        return None
    value = header.strip(" \t")
    if len(value) < _TRACEPARENT_LEN:
        return None
    version = value[:2]
    if not _is_hex(version, 2) or version == "ff":
        return None
    # Version 00 has exactly four fields; a later version may append fields after a '-'
    # and must still be parsed as 00 (§3.2.4 "versioning of traceparent").
    if version == "00" and len(value) != _TRACEPARENT_LEN:
        return None
    if len(value) > _TRACEPARENT_LEN and value[_TRACEPARENT_LEN] != "-":
        return None
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    trace_id, span_id, flags = value[3:35], value[36:52], value[53:55]
    if not (_is_hex(trace_id, 32) and _is_hex(span_id, 16) and _is_hex(flags, 2)):
        return None
    if trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def new_trace_id(rng: random.Random | None = None) -> str:
    """32 lowercase hex, random, never all zero."""
    rng = rng or _DEFAULT_RNG
    while True:
        bits = rng.getrandbits(128)
        if bits:
            return f"{bits:032x}"


def new_span_id(rng: random.Random | None = None) -> str:
    """16 lowercase hex, random, never all zero."""
    rng = rng or _DEFAULT_RNG
    while True:
        bits = rng.getrandbits(64)
        if bits:
            return f"{bits:016x}"


def format_traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    """`00-{trace_id}-{span_id}-{01|00}`; raises ValueError on ids a peer would reject."""
    if not _is_hex(trace_id, 32) or trace_id == _ZERO_TRACE_ID:
        raise ValueError(f"invalid trace id {trace_id!r}")
    if not _is_hex(span_id, 16) or span_id == _ZERO_SPAN_ID:
        raise ValueError(f"invalid span id {span_id!r}")
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def server_timing_value(traceparent: str, beacon_token: str | None = None) -> str:
    """The `Server-Timing` header value carrying the server span's context, and the beacon
    token the probe returns to prove the beacon is for this response (a hex string, so a
    Server-Timing token too; tracer/web/probe/token.py).

    >>> server_timing_value("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "ab12")
    'trace;desc=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, beacon;desc=ab12'
    """
    if beacon_token is None:
        return f"trace;desc={traceparent}"
    return f"trace;desc={traceparent}, beacon;desc={beacon_token}"


# One Server-Timing param value: a quoted-string (with \-escapes) or a token (RFC 9110 §5.6).
_PARAM_VALUE = r'"(?:[^"\\]|\\.)*"|[^\s,;"]*'
_PARAM = re.compile(r'\s*;\s*([^\s=;,]+)\s*(?:=\s*(' + _PARAM_VALUE + r'))?')
_METRIC = re.compile(r'\s*([^\s=;,"]+)')


def parse_server_timing(header: str | None) -> str | None:
    """The traceparent in a `Server-Timing` header's `trace` metric, or None.

    >>> parse_server_timing('cache;dur=2.5, trace;desc="00-4bf92f3577b34da6a3ce929d0e0e4736'
    ...                     '-00f067aa0ba902b7-01"')
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
    """
    if not isinstance(header, str):
        return None
    for name, params in _metrics(header):
        if name.lower() == "trace":
            parsed = parse_traceparent(params.get("desc"))
            return str(parsed) if parsed else None
    return None


def parse_server_timing_desc(header: str | None, metric: str) -> str | None:
    """The `desc` of the first `metric` in a `Server-Timing` header, or None.

    >>> parse_server_timing_desc('trace;desc=x, beacon;desc="ab12"', "beacon")
    'ab12'
    """
    if not isinstance(header, str):
        return None
    for name, params in _metrics(header):
        if name.lower() == metric:
            return params.get("desc")
    return None


def _metrics(header: str):
    """Yield (name, {param: value}) for each comma-separated metric; stop at garbage."""
    pos = 0
    while pos < len(header):
        match = _METRIC.match(header, pos)
        if not match:
            return
        name, pos, params = match.group(1), match.end(), {}
        while (param := _PARAM.match(header, pos)):
            key, raw = param.group(1).lower(), param.group(2) or ""
            if raw.startswith('"'):
                raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
            params.setdefault(key, raw)   # first occurrence wins (Server-Timing spec)
            pos = param.end()
        yield name, params
        rest = re.match(r"\s*(,|$)", header[pos:])
        if not rest:
            return
        pos += rest.end()
