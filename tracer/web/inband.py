"""The in-band timing line: the server's own timing, signed, at the end of an SSE stream.

A beacon that reaches a process that did not serve its request (another replica, a
standalone collector, `python -m tracer collect`) cannot be joined to a server record. So
when the probe asks for it with the request header `X-TTFT-Timing: 1`, the server (engine or
proxy) adds one SSE comment right before `data: [DONE]` (docs/reference.md, "The in-band
timing line"):

    : ttft-timing <base64url payload>.<base64url HMAC-SHA256(beacon key, payload)>

Lines starting with `:` are comments in the SSE spec: EventSource, the `openai` SDKs and any
conforming parser skip them. Without the header the stream is byte-identical to a stream
without this feature. The payload holds what the collector needs to place the browser on the
server's clock (receive start in Unix ns, response start and first content sent in ms after
it) and to detect a buffering intermediary (the send offsets of the first content events).
The probe copies the token into its beacon's `server` field; `decode_token` checks it.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field

from tracer.record.output_segments import attribute_outputs
from tracer.record.clock import Clock
from tracer.record.emits import MAX_SEND_TIMES
from tracer.record.timeline import NullTimeline
from tracer.record.traceparent import is_trace_id
from tracer.web.openai_http import header_value
from tracer.web.probe.token import BeaconSigner

TIMING_HEADER = b"x-ttft-timing"
COMMENT_PREFIX = b": ttft-timing "
PAYLOAD_VERSION = 1
SOURCES = ("engine", "proxy")
# A payload with MAX_SEND_TIMES send offsets and nine stages is ~700 characters; the beacon's
# bound.
MAX_TOKEN_CHARS = 2048
_TOKEN = re.compile(r"([A-Za-z0-9_-]{1,2000})\.([A-Za-z0-9_-]{43})")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_MODEL = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
_STAGE = re.compile(r"[a-z_]{1,32}")
_MAX_MS = 86_400_000.0


class InbandError(ValueError):
    """A `server` token that is malformed, not signed by our key, or not a timing payload."""


@dataclass(slots=True, frozen=True)
class InbandTiming:
    """The decoded payload. Offsets are ms after `recv_unix_ns` (the server's receive start).

    >>> t = InbandTiming("ab" * 16, "cd" * 8, "engine", "m", 1_700_000_000_000_000_000, 1.5,
    ...                  20.25, (20.25, 30.0))
    >>> decode_token(encode_token(t, BeaconSigner(b"k")), BeaconSigner(b"k")) == t
    True
    """

    trace_id: str
    span_id: str
    source: str
    model: str
    recv_unix_ns: int
    resp_ms: float
    ttft_ms: float | None
    send_ms: tuple[float, ...] = ()
    stages_ms: dict = field(default_factory=dict)

    def payload(self) -> dict:
        out = {"v": PAYLOAD_VERSION, "trace_id": self.trace_id, "span_id": self.span_id,
               "source": self.source, "model": self.model, "recv_unix_ns": self.recv_unix_ns,
               "resp_ms": self.resp_ms, "ttft_ms": self.ttft_ms, "send_ms": list(self.send_ms)}
        if self.stages_ms:
            out["stages_ms"] = dict(self.stages_ms)
        return out


def wants_timing(scope: dict) -> bool:
    """Whether the request opted in: `X-TTFT-Timing: 1` (any other value is no).

    >>> wants_timing({"headers": [(b"x-ttft-timing", b"1")]}), wants_timing({"headers": []})
    (True, False)
    """
    return header_value(scope, TIMING_HEADER) == b"1"


def encode_token(timing: InbandTiming, signer: BeaconSigner) -> str:
    """`<payload>.<sig>`: compact, key-sorted JSON, base64url without padding, signed."""
    raw = json.dumps(timing.payload(), separators=(",", ":"), sort_keys=True).encode()
    payload = base64.urlsafe_b64encode(raw).rstrip(b"=")
    return payload.decode("ascii") + "." + signer.sign(payload)


def timing_line(timing: InbandTiming, signer: BeaconSigner) -> bytes:
    """The SSE comment event carrying the token.

    >>> t = InbandTiming("ab" * 16, "cd" * 8, "proxy", "m", 1, 0.5, None)
    >>> line = timing_line(t, BeaconSigner(b"k"))
    >>> line.startswith(b": ttft-timing eyJ"), line.endswith(b"\\n\\n")
    (True, True)
    """
    return COMMENT_PREFIX + encode_token(timing, signer).encode("ascii") + b"\n\n"


def decode_token(token: str, signer: BeaconSigner | None) -> InbandTiming:
    """The checked payload of `token`, or InbandError. With `signer`, the signature is
    checked first (constant time); None skips it (only for tests of the decoding)."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        raise InbandError("the server token is not a string of at most 2048 characters")
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise InbandError("the server token is not <base64url>.<base64url>")
    payload, sig = match.groups()
    if signer is not None and not signer.verify_signature(payload.encode("ascii"), sig):
        raise InbandError("the server token's signature does not match")
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (binascii.Error, ValueError, RecursionError):
        raise InbandError("the server token's payload is not base64url JSON") from None
    return _checked(obj)


def _no_constant(name: str):
    raise ValueError(name)


def _checked(obj: object) -> InbandTiming:
    if not isinstance(obj, dict) or obj.get("v") != PAYLOAD_VERSION:
        raise InbandError("the server token's payload is not a version 1 timing object")
    trace_id, span_id = obj.get("trace_id"), obj.get("span_id")
    if not isinstance(trace_id, str) or not is_trace_id(trace_id) or trace_id == "0" * 32:
        raise InbandError("the server token's trace_id is not 32 hex digits")
    if not isinstance(span_id, str) or not _SPAN_ID.fullmatch(span_id) or span_id == "0" * 16:
        raise InbandError("the server token's span_id is not 16 hex digits")
    source, model = obj.get("source"), obj.get("model")
    if source not in SOURCES or not isinstance(model, str) or not _MODEL.fullmatch(model):
        raise InbandError("the server token's source or model is invalid")
    recv = obj.get("recv_unix_ns")
    if type(recv) is not int or not 0 < recv < 1 << 63:
        raise InbandError("the server token's recv_unix_ns is not a positive int64")
    send = obj.get("send_ms")
    if not isinstance(send, list) or len(send) > MAX_SEND_TIMES:
        raise InbandError(f"the server token's send_ms is not a list of at most "
                          f"{MAX_SEND_TIMES} times")
    send_ms = tuple(_ms(v) for v in send)
    if any(b < a for a, b in zip(send_ms, send_ms[1:])):
        raise InbandError("the server token's send_ms decreases")
    stages = obj.get("stages_ms", {})
    if not isinstance(stages, dict) or len(stages) > 16 or not all(
            isinstance(k, str) and _STAGE.fullmatch(k) for k in stages):
        raise InbandError("the server token's stages_ms is not a map of stage names")
    ttft = obj.get("ttft_ms")
    return InbandTiming(trace_id, span_id, source, model, recv, _ms(obj.get("resp_ms")),
                        None if ttft is None else _ms(ttft), send_ms,
                        {k: _ms(v) for k, v in stages.items()})


def _ms(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InbandError("a server token time is not a number")
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= _MAX_MS:
        raise InbandError("a server token time is out of range")
    return value


class InbandTimer:
    """Builds one request's timing line from its live timeline (engine or proxy).

    >>> from tracer.record.timeline import Timeline
    >>> timer = InbandTimer(BeaconSigner(b"k"), Clock(wall_ns=10**18, perf_ns=0),
    ...                     source="engine", stages=("receive", "send"))
    >>> tl = Timeline(1_000_000); tl.mark("receive", 1_500_000)
    >>> tl.event("response_start", 2_000_000); tl.mark("send", 5_000_000)
    >>> tl.emit(5_000_000); tl.emit(6_500_000)
    >>> t = timer.timing(tl, trace_id="ab" * 16, span_id="cd" * 8, model="m")
    >>> t.recv_unix_ns, t.resp_ms, t.ttft_ms, t.send_ms, t.stages_ms
    (1000000000001000000, 1.0, 4.0, (4.0, 5.5), {'receive': 0.5, 'send': 3.5})
    """

    __slots__ = ("signer", "clock", "source", "stages")

    def __init__(self, signer: BeaconSigner, clock: Clock, *, source: str,
                 stages: tuple[str, ...]) -> None:
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}")
        self.signer, self.clock, self.source = signer, clock, source
        self.stages = tuple(stages)

    @classmethod
    def of(cls, obs) -> "InbandTimer":
        """The timer of an `Observability` (its key, clock, source and stages)."""
        return cls(obs.beacon_signer, obs.clock, source=obs.tracer.source, stages=obs.stages)

    def timing(self, timeline, *, trace_id: str, span_id: str, model: str) -> InbandTiming:
        """The payload; `model` is a label already (`ActiveRequest.model`, folded by
        `Tracer.begin`), so it is written as given."""
        snap = timeline.snapshot()
        start = snap.start_ns
        resp = next((t for name, t, _a in snap.events if name == "response_start"), None)
        # The stages, the output segments and the TTFT end (the first text) as the record will
        # have them: one rule (tracer/record/output_segments.py).
        attribution, outputs = attribute_outputs(snap, self.stages)
        send = None if outputs.ttft_ns is None else start + outputs.ttft_ns
        return InbandTiming(
            trace_id, span_id, self.source, model,
            self.clock.to_epoch_ns(start), _rel_ms(resp, start) or 0.0, _rel_ms(send, start),
            tuple(_rel_ms(t, start) for t in snap.first_emits_ns),
            {span.stage: round(span.duration_ns / 1e6, 3)
             for span in attribution.spans + outputs.segments})

    def line(self, active) -> bytes:
        """The comment event for an `ActiveRequest`; b"" when tracing is off (no timeline)."""
        if isinstance(active.timeline, NullTimeline):   # tracing off: nothing was measured
            return b""
        return timing_line(self.timing(active.timeline, trace_id=active.trace_id,
                                       span_id=active.span_id, model=active.model), self.signer)


def _rel_ms(t_ns: int | None, start_ns: int) -> float | None:
    # µs resolution keeps the line short; negative cannot happen on one monotonic clock.
    return None if t_ns is None else round(max(t_ns - start_ns, 0) / 1e6, 3)
