"""`POST /v1/probe`: browser beacons in, joined to the server's trace, metrics and spans out.

The endpoint faces the open internet (sendBeacon cannot send an API key), so it is cheap to
refuse: the per-client rate limit is checked before the body is read, the body is read only
up to the size limit, and only a fully checked `Beacon` reaches the store. Every outcome is
counted in `llm_probe_beacons_total{outcome}`; no beacon value ever becomes a label.

CORS: responses carry `Access-Control-Allow-Origin` (with credentials: sendBeacon sends in
`include` mode) only for allow-listed origins, and the preflight is answered only for them.
A `text/plain` beacon needs no preflight, so the allow-list governs what browsers may read
and preflight, not who may post: anyone can post with curl anyway, and the rate limit and the
schema are what protect the server.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from tracer.probe_schema import Beacon, BeaconError, parse_beacon
from tracer.probe_spans import ClientSpanEmitter, align, place_client_stages
from tracer.record import RequestRecord

DEFAULT_MAX_BYTES = 16 * 1024
_ACCEPTED_TYPES = frozenset(("application/json", "text/plain", ""))
_log = logging.getLogger(__name__)


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

    >>> from tracer.store import TraceStore
    >>> ingestor = ProbeIngestor(store=TraceStore())
    >>> beacon = parse_beacon(b'{"v":1,"trace_id":"' + b"1" * 32 + b'","outcome":"ok","t":{"start":0,"end":5}}')
    >>> ingestor.ingest(beacon)     # no server record with that trace id
    'unmatched'
    """

    def __init__(self, *, store, metrics=None, span_builder=None) -> None:
        self.store = store
        self.metrics = metrics
        self._spans = None if span_builder is None else ClientSpanEmitter(span_builder)

    def ingest(self, beacon: Beacon) -> str:
        """"accepted" once joined; "unmatched" when no un-joined record has the trace id (the
        first beacon of a request wins, so a replay cannot overwrite or double-count it)."""
        if beacon.trace_id is None:
            return "unmatched"
        record = self.store.get(beacon.trace_id)
        if record is None or record.client is not None:
            return "unmatched"
        alignment = align(record, beacon.t)
        stages = () if alignment is None else place_client_stages(beacon.t, alignment)
        view = client_view(record, beacon, alignment, stages)
        if self.store.attach_client(beacon.trace_id, view) is not record:
            return "unmatched"  # evicted (or replaced) between the lookup and the join
        if self.metrics is not None:
            self.metrics.observe_client(record.model, _s(view["client_ttft_ms"]),
                                        _s(view["network_overhead_ms"]),
                                        _s(view["render_delay_ms"]), record.trace_id)
        if self._spans is not None and alignment is not None:
            try:
                self._spans.emit(record, beacon, alignment, stages)
            except Exception:  # a span sink must never fail the beacon
                _log.exception("ttftscope: emitting client spans failed")
        return "accepted"


def client_view(record: RequestRecord, beacon: Beacon, alignment, stages) -> dict:
    """What `record.client` holds: the checked beacon plus the joined numbers. Stage times are
    on the server's perf_counter axis, like the record's own stages."""
    t = beacon.t
    view = beacon.as_dict()
    server_ttft_ms = None if record.ttft_ns is None else record.ttft_ns / 1e6
    view["client_ttft_ms"] = t.first_token
    view["network_overhead_ms"] = (None if t.first_token is None or server_ttft_ms is None
                                   else t.first_token - server_ttft_ms)
    view["render_delay_ms"] = (None if t.first_paint is None or t.first_token is None
                               else t.first_paint - t.first_token)
    view["clock"] = None if alignment is None else alignment.as_dict()
    view["stages"] = [{"stage": s.stage, "start_ns": s.start_ns, "end_ns": s.end_ns}
                      for s in stages]
    return view


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def make_probe_router(*, store, metrics, span_builder=None, cors_origins: Iterable[str] = (),
                      max_bytes: int = DEFAULT_MAX_BYTES, rate_per_s: float = 20.0,
                      burst: int = 40, clock: Callable[[], float] = time.monotonic,
                      max_clients: int = 10_000, path: str = "/v1/probe") -> APIRouter:
    """The beacon endpoint as a router, for the engine server and the standalone sidecar.

    >>> from fastapi import FastAPI
    >>> from tracer.store import TraceStore
    >>> app = FastAPI()
    >>> app.include_router(make_probe_router(store=TraceStore(), metrics=None))
    """
    endpoint = ProbeEndpoint(
        ProbeIngestor(store=store, metrics=metrics, span_builder=span_builder),
        TokenBucketLimiter(rate_per_s, burst, max_keys=max_clients, clock=clock),
        metrics=metrics, cors_origins=cors_origins, max_bytes=max_bytes)
    router = APIRouter()
    router.add_api_route(path, endpoint.post, methods=["POST"], status_code=202)
    router.add_api_route(path, endpoint.preflight, methods=["OPTIONS"])
    return router


class ProbeEndpoint:
    """The two handlers of the beacon path: POST (the beacon) and OPTIONS (CORS preflight).

    Checks run cheapest first: rate limit (no body read), media type, size, schema.
    """

    def __init__(self, ingestor: ProbeIngestor, limiter: TokenBucketLimiter, *, metrics,
                 cors_origins: Iterable[str], max_bytes: int) -> None:
        self.ingestor = ingestor
        self.limiter = limiter
        self.count = (lambda outcome: None) if metrics is None else metrics.count_beacon
        self.allowed = frozenset(cors_origins)
        self.max_bytes = max_bytes

    async def post(self, request: Request) -> Response:
        cors = _cors_headers(request.headers.get("origin"), self.allowed)
        wait_s = self.limiter.acquire(request.client.host if request.client else "unknown")
        if wait_s > 0.0:
            self.count("rate_limited")
            return _error(429, "too many probe beacons from this client", "rate_limit_exceeded",
                          {**cors, "Retry-After": str(math.ceil(wait_s))})
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in _ACCEPTED_TYPES:
            self.count("rejected_schema")
            return _error(415, "a beacon is application/json or text/plain",
                          "unsupported_media_type", cors)
        body = await _read_limited(request, self.max_bytes)
        if body is None:
            self.count("rejected_size")
            return _error(413, f"a beacon is at most {self.max_bytes} bytes",
                          "request_too_large", cors)
        try:
            beacon = parse_beacon(body)
        except BeaconError as exc:
            self.count("rejected_schema")
            return _error(exc.status, exc.message, "invalid_beacon", cors, exc.param)
        self.count(self.ingestor.ingest(beacon))
        return Response(status_code=202, headers=cors)

    async def preflight(self, request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin not in self.allowed:
            return _error(403, "origin not allowed to send probe beacons", "origin_not_allowed", {})
        return Response(status_code=204, headers={
            **_cors_headers(origin, self.allowed), "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": "content-type", "Access-Control-Max-Age": "600"})


async def _read_limited(request: Request, max_bytes: int) -> bytes | None:
    """The body, or None once it is known to exceed `max_bytes` (declared or read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return None
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                return None
            chunks.append(chunk)
    except ClientDisconnect:
        return b""  # nothing usable arrived: parse_beacon answers 400
    return b"".join(chunks)


def _cors_headers(origin: str | None, allowed: frozenset[str]) -> dict[str, str]:
    if origin is None or origin not in allowed:
        return {}
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
            "Vary": "Origin"}


def _error(status: int, message: str, code: str, headers: dict, param: str | None = None):
    type_ = "rate_limit_error" if status == 429 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)
