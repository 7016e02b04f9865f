"""`POST /v1/probe`: browser beacons in, joined to the server's trace, metrics and spans out.

The endpoint faces the open internet (sendBeacon cannot send an API key), so it is cheap to
refuse: the per-client rate limit is checked before the body is read, the body is read only
up to the size limit, and only a fully checked `Beacon` reaches the store. Every outcome is
counted in `llm_probe_beacons_total{outcome}`; no beacon value ever becomes a label.

CORS is the app's one policy (`tracer.web.cors`, credentials allowed because sendBeacon
sends in `include` mode). A `text/plain` beacon needs no preflight, so the allow-list
governs what browsers may read and preflight, not who may post: anyone can post with curl
anyway, and the rate limit and the schema are what protect the server.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from tracer.web.probe.schema import Beacon, BeaconError, parse_beacon
from tracer.web.probe.token import BeaconSigner
from tracer.web.probe.client_phases import chunk_gaps_ms, client_stage_ms
from tracer.web.probe.alignment import (ClockAlignment, ClientStage, align, align_inband,
                                        place_client_stages)
from tracer.web.probe.buffering import BufferingVerdict, detect_buffering
from tracer.web.inband import InbandError, InbandTiming, decode_token
from tracer.record.request_record import RequestRecord
from tracer.web.openai_http import OpenAIError, read_body

DEFAULT_MAX_BYTES = 16 * 1024
_ACCEPTED_TYPES = frozenset(("application/json", "text/plain", ""))
_log = logging.getLogger(__name__)
_MS = {"type": "number", "minimum": 0}
_MS_OR_NULL = {"type": ["number", "null"], "minimum": 0}
# The beacon as /openapi.json documents it (frontend_probe/README.md field by field; the
# schema module is what enforces it). The body is read raw, so FastAPI needs it spelled out.
_BEACON_SCHEMA = {
    "type": "object", "required": ["v", "outcome", "t"],
    "properties": {
        "v": {"const": 1}, "trace_id": {"type": ["string", "null"], "pattern": "^[0-9a-f]{32}$"},
        "token": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "traceparent": {"type": "string"}, "url_path": {"type": "string"},
        "status": {"type": ["integer", "null"], "minimum": 100, "maximum": 599},
        "outcome": {"enum": ["ok", "http_error", "aborted", "network_error"]},
        "t": {"type": "object", "required": ["start", "end"],
              "properties": {"start": {"const": 0}, "headers": _MS_OR_NULL,
                             "first_byte": _MS_OR_NULL, "first_token": _MS_OR_NULL,
                             "first_paint": _MS_OR_NULL, "end": _MS}},
        "chunks": {"type": "integer", "minimum": 0}, "probe_errors": {"type": "integer", "minimum": 0},
        "itl_ms": {"type": ["object", "null"]}, "resource": {"type": ["object", "null"]},
        "sdk": {"type": "string"}, "model": {"type": "string"},
        "chunk_ms": {"type": "array", "items": _MS, "maxItems": 32},
        "server": {"type": "string", "maxLength": 2048,
                   "pattern": "^[A-Za-z0-9_-]{1,2000}\\.[A-Za-z0-9_-]{43}$"}}}
_ERROR_REF = {"application/json": {"schema": {"type": "object", "required": ["error"]}}}
_OPENAPI = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _BEACON_SCHEMA},
                                                  "text/plain": {"schema": _BEACON_SCHEMA}}},
    "responses": {"202": {"description": "Accepted, joined or unmatched"},
                  **{str(status): {"description": text, "content": _ERROR_REF}
                     for status, text in ((400, "Not JSON"),
                                          (403, "Missing or wrong token or signature"),
                                          (413, "Too large"), (415, "Wrong media type"),
                                          (422, "Wrong shape or implausible"),
                                          (429, "Rate limited"))}}}


class TokenBucketLimiter:
    """Token buckets keyed by client, at most `max_keys` of them (least recently seen evicted),
    so a flood from many addresses costs bounded memory.

    >>> now = [0.0]
    >>> limiter = TokenBucketLimiter(rate_per_s=1.0, burst=2, clock=lambda: now[0])
    >>> [limiter.acquire("1.2.3.4") for _ in range(3)]   # 0.0: allowed; else seconds to wait
    [0.0, 0.0, 1.0]
    >>> now[0] = 1.0; limiter.acquire("1.2.3.4")
    0.0
    """

    def __init__(self, rate_per_s: float, burst: int, *, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate_per_s > 0, burst >= 1 and max_keys >= 1 are required")
        self.rate_per_s, self.burst, self.max_keys = float(rate_per_s), int(burst), max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key → (tokens, t_s)
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float:
        """Take one token: 0.0 when allowed, else the seconds until one is available."""
        now_s = self._clock()
        with self._lock:
            tokens, last_s = self._buckets.pop(key, (float(self.burst), now_s))
            tokens = min(self.burst, tokens + max(now_s - last_s, 0.0) * self.rate_per_s)
            wait_s = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate_per_s
            self._buckets[key] = (tokens - 1.0 if wait_s == 0.0 else tokens, now_s)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        return wait_s

    def __len__(self) -> int:
        return len(self._buckets)


class ProbeIngestor:
    """Joins checked beacons to server records: store, client metrics, client spans.

    >>> from tracer.sinks.store import TraceStore
    >>> ingestor = ProbeIngestor(store=TraceStore())
    >>> beacon = parse_beacon(b'{"v":1,"trace_id":"' + b"1" * 32 + b'","outcome":"ok","t":{"start":0,"end":5}}')
    >>> ingestor.ingest(beacon)     # no server record with that trace id
    'unmatched'
    """

    def __init__(self, *, store, metrics=None, span_builder=None,
                 max_remote_joins: int = 10_000) -> None:
        self.store = store
        self.metrics = metrics
        self._spans = span_builder
        # Trace ids joined from in-band timing (no local record), newest last: the first
        # beacon of a trace wins here too, in bounded memory.
        self._remote_joined: OrderedDict[str, None] = OrderedDict()
        self._max_remote_joins = max_remote_joins
        self._lock = threading.Lock()

    def ingest(self, beacon: Beacon, server: InbandTiming | None = None) -> str:
        """"accepted" once joined; "unmatched" when no un-joined record has the trace id (the
        first beacon of a request wins, so a replay cannot overwrite or double-count it).

        `server` is the beacon's checked in-band timing: with no local record (another
        replica served the request, or this is a standalone collector) the beacon is joined
        from it alone: client TTFT, network + gateway time, buffering, the client spans. A
        local record, when there is one, is still joined for /ui."""
        trace_id = server.trace_id if server is not None else beacon.trace_id
        if trace_id is None:
            return "unmatched"
        record = self.store.get(trace_id)
        if record is None:
            return "unmatched" if server is None else self._ingest_remote(beacon, server)
        if record.client is not None:
            return "unmatched"
        alignment = align(record, beacon.t)
        stages = () if alignment is None else place_client_stages(beacon.t, alignment)
        verdict = detect_buffering(server.send_ms if server is not None
                                   else record_send_ms(record), beacon.chunk_ms)
        view = client_view(record, beacon, alignment, stages, verdict)
        if self.store.attach_client(trace_id, view) is not record:
            return "unmatched"  # evicted (or replaced) between the lookup and the join
        self._observe(record.model, view, beacon, trace_id, verdict)
        if self._spans is not None and alignment is not None:
            try:
                emit_client_spans(self._spans, record, beacon, alignment, stages, verdict)
            except Exception:  # a span sink must never fail the beacon
                _log.exception("ttftscope: emitting client spans failed")
        return "accepted"

    def _ingest_remote(self, beacon: Beacon, server: InbandTiming) -> str:
        with self._lock:
            if server.trace_id in self._remote_joined:
                return "unmatched"
            self._remote_joined[server.trace_id] = None
            if len(self._remote_joined) > self._max_remote_joins:
                self._remote_joined.popitem(last=False)
        alignment = align_inband(server, beacon.t)
        stages = () if alignment is None else place_client_stages(beacon.t, alignment)
        verdict = detect_buffering(server.send_ms, beacon.chunk_ms)
        view = joined_numbers(beacon, server.ttft_ms)
        self._observe(server.model, view, beacon, server.trace_id, verdict)
        if self._spans is not None and alignment is not None:
            try:
                _emit_spans(self._spans, server.trace_id, server.span_id, beacon, alignment,
                            stages, verdict, {"llm.client.join": "inband",
                                              "llm.server.source": server.source},
                            epoch=True)
            except Exception:  # a span sink must never fail the beacon
                _log.exception("ttftscope: emitting client spans failed")
        return "accepted"

    def _observe(self, model: str, view: dict, beacon: Beacon, trace_id: str,
                 verdict: BufferingVerdict | None) -> None:
        if self.metrics is None:
            return
        self.metrics.observe_client(model, _s(view["client_ttft_ms"]),
                                    _s(view["network_overhead_ms"]),
                                    _s(view["render_delay_ms"]), trace_id,
                                    stages_s={k: v / 1e3 for k, v in
                                              client_stage_ms(beacon).items()},
                                    itl_s=[g / 1e3 for g in chunk_gaps_ms(beacon)])
        if verdict is not None:
            self.metrics.observe_buffering(model, verdict.buffered, verdict.held_back_ms / 1e3,
                                           trace_id)

    @property
    def num_remote_joins(self) -> int:
        """Trace ids remembered from in-band joins (bounded by `max_remote_joins`)."""
        return len(self._remote_joined)


def record_send_ms(record: RequestRecord) -> list[float]:
    """The send offsets (ms after receive start) of a record's first content events, rebuilt
    from its TTFT and inter-token gaps: the server side of the buffering check in-process.

    >>> r = RequestRecord("r", "1" * 32, "1" * 16, "m", "chat", 0, 1)
    >>> r.ttft_ns, r.itl_ns = 4_000_000, (1_000_000, 2_500_000)
    >>> record_send_ms(r)
    [4.0, 5.0, 7.5]
    """
    if record.ttft_ns is None:
        return []
    out, t_ns = [record.ttft_ns / 1e6], record.ttft_ns
    for gap_ns in record.itl_ns[:31]:
        t_ns += gap_ns
        out.append(t_ns / 1e6)
    return out


def emit_client_spans(span_builder, record: RequestRecord, beacon: Beacon,
                      alignment: ClockAlignment, stages: tuple[ClientStage, ...],
                      verdict: BufferingVerdict | None = None) -> None:
    """The beacon's spans, placed on the server's axis, through the span sink's public API."""
    _emit_spans(span_builder, record.trace_id, record.span_id, beacon, alignment, stages,
                verdict, {"llm.request_id": record.request_id})


def _emit_spans(span_builder, trace_id: str, server_span_id: str, beacon: Beacon,
                alignment: ClockAlignment, stages: tuple[ClientStage, ...],
                verdict: BufferingVerdict | None, extra: dict, *, epoch: bool = False) -> None:
    clock = {"llm.client.clock_skew_ms": alignment.offset_ns / 1e6,
             "llm.client.clock_uncertainty_ms": alignment.uncertainty_ns / 1e6,
             "llm.client.clock_anchor": alignment.anchor}
    attrs = {**clock, "llm.client.outcome": beacon.outcome, "llm.client.chunks": beacon.chunks,
             **extra}
    if verdict is not None:
        attrs["llm.client.buffered"] = verdict.buffered
        attrs["llm.client.held_back_ms"] = verdict.held_back_ms
    if beacon.status is not None:
        attrs["http.response.status_code"] = beacon.status
    if beacon.url_path is not None:
        attrs["url.path"] = beacon.url_path
    span_builder.emit_client_spans(
        trace_id=trace_id, server_span_id=server_span_id,
        client_traceparent=beacon.traceparent,
        start_ns=alignment.to_server_ns(beacon.t.start),
        end_ns=alignment.to_server_ns(max(beacon.t.end, beacon.t.first_paint or 0.0)),
        stages=[(s.stage, s.start_ns, s.end_ns) for s in stages], attributes=attrs,
        stage_attributes=clock, error=None if beacon.outcome == "ok" else beacon.outcome,
        epoch=epoch)


def joined_numbers(beacon: Beacon, server_ttft_ms: float | None) -> dict:
    """Client TTFT, network + gateway time (client TTFT − server TTFT) and render delay."""
    t = beacon.t
    return {"client_ttft_ms": t.first_token,
            "network_overhead_ms": (None if t.first_token is None or server_ttft_ms is None
                                    else t.first_token - server_ttft_ms),
            "render_delay_ms": (None if t.first_paint is None or t.first_token is None
                                else t.first_paint - t.first_token)}


def client_view(record: RequestRecord, beacon: Beacon, alignment, stages,
                verdict: BufferingVerdict | None = None) -> dict:
    """What `record.client` holds: the checked beacon plus the joined numbers. Stage times are
    on the server's perf_counter axis, like the record's own stages."""
    view = beacon.as_dict()
    view.update(joined_numbers(beacon, None if record.ttft_ns is None else record.ttft_ns / 1e6))
    view["clock"] = None if alignment is None else alignment.as_dict()
    view["stages"] = [{"stage": s.stage, "start_ns": s.start_ns, "end_ns": s.end_ns}
                      for s in stages]
    view["buffering"] = None if verdict is None else {
        "buffered": verdict.buffered, "held_back_ms": verdict.held_back_ms,
        "num_events": verdict.num_events}
    return view


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def make_probe_router(*, store, metrics, span_builder=None, signer: BeaconSigner | None = None,
                      max_bytes: int = DEFAULT_MAX_BYTES, rate_per_s: float = 20.0,
                      burst: int = 40, clock: Callable[[], float] = time.monotonic,
                      max_clients: int = 10_000, path: str = "/v1/probe",
                      max_remote_joins: int = 10_000) -> APIRouter:
    """The beacon endpoint as a router, for the engine server and the sidecar. CORS is the
    app's (`tracer.web.cors`), as for every other path. With `signer` (what
    `build_observability` always passes), a beacon with a trace id must carry that trace's
    token; None skips the check (unit tests of the join).

    >>> from fastapi import FastAPI
    >>> from tracer.sinks.store import TraceStore
    >>> app = FastAPI()
    >>> app.include_router(make_probe_router(store=TraceStore(), metrics=None))
    """
    endpoint = ProbeEndpoint(
        ProbeIngestor(store=store, metrics=metrics, span_builder=span_builder,
                      max_remote_joins=max_remote_joins),
        TokenBucketLimiter(rate_per_s, burst, max_keys=max_clients, clock=clock),
        metrics=metrics, max_bytes=max_bytes, signer=signer)
    router = APIRouter()
    router.add_api_route(path, endpoint.post, methods=["POST"], status_code=202,
                         openapi_extra=_OPENAPI, summary="A browser probe beacon")
    router.probe_endpoint = endpoint   # its ingestor and limiter, for tests and benches
    return router


class ProbeEndpoint:
    """The beacon handler. Checks run cheapest first: rate limit (no body read), media type,
    size, schema, token. Every refusal is an OpenAI-shaped error with its own status."""

    def __init__(self, ingestor: ProbeIngestor, limiter: TokenBucketLimiter, *, metrics,
                 max_bytes: int, signer: BeaconSigner | None = None) -> None:
        self.ingestor = ingestor
        self.signer = signer
        self.limiter = limiter
        self.count = (lambda outcome: None) if metrics is None else metrics.count_beacon
        self.max_bytes = max_bytes

    async def post(self, request: Request) -> Response:
        wait_s = self.limiter.acquire(request.client.host if request.client else "unknown")
        if wait_s > 0.0:
            self.count("rate_limited")
            return OpenAIError(429, "too many probe beacons from this client",
                               code="rate_limit_exceeded", type_="rate_limit_error").response(
                {"Retry-After": str(math.ceil(wait_s))})
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in _ACCEPTED_TYPES:
            self.count("rejected_schema")
            return OpenAIError(415, "a beacon is application/json or text/plain",
                               code="unsupported_media_type").response()
        try:
            body = await read_body(request, self.max_bytes)
        except OpenAIError:
            self.count("rejected_size")
            return OpenAIError(413, f"a beacon is at most {self.max_bytes} bytes",
                               code="request_too_large").response()
        except ClientDisconnect:
            body = b""   # nothing usable arrived: parse_beacon answers 400
        try:
            beacon = parse_beacon(body)
        except BeaconError as exc:
            self.count("rejected_schema")
            return OpenAIError(exc.status, exc.message, code="invalid_beacon",
                               param=exc.param).response()
        server = None
        if beacon.server is not None:
            # The signed in-band timing (tracer/web/inband.py) proves the beacon came from
            # the browser that read that stream: it stands for the token, on any process
            # holding the key.
            try:
                server = decode_token(beacon.server, self.signer)
                if beacon.trace_id is not None and server.trace_id != beacon.trace_id:
                    raise InbandError("the server token is for another trace")
            except InbandError as exc:
                self.count("rejected_signature")
                return OpenAIError(403, str(exc), param="server",
                                   code="invalid_server_timing",
                                   type_="permission_error").response()
        elif (self.signer is not None and beacon.trace_id is not None
                and not self.signer.verify(beacon.trace_id, beacon.token)):
            # 403, not 401: the token is not an HTTP authentication scheme to retry with.
            self.count("rejected_token")
            missing = beacon.token is None
            return OpenAIError(
                403, "the beacon's token is missing: send the `beacon` desc of the response's "
                "Server-Timing header as `token`" if missing else
                "the beacon's token does not match its trace id", param="token",
                code="missing_beacon_token" if missing else "invalid_beacon_token",
                type_="permission_error").response()
        self.count(self.ingestor.ingest(beacon, server))
        return Response(status_code=202)
