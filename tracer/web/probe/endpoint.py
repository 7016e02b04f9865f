"""`POST /v1/probe`, the HTTP side: cheap refusals first, then `ProbeIngestor`.

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

import math
import time
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from tracer.web.inband import InbandError, decode_token
from tracer.web.openai_http import ERROR_SCHEMA, OpenAIError, read_body
from tracer.web.probe.beacon_error import BeaconError
from tracer.web.probe.ingest import MAX_REMOTE_JOINS, ProbeIngestor, stale_token_error
from tracer.web.probe.rate_limit import TokenBucketLimiter
from tracer.web.probe.schema import beacon_json_schema, parse_beacon
from tracer.web.probe.token import BeaconSigner

DEFAULT_MAX_BYTES = 16 * 1024
_ACCEPTED_TYPES = frozenset(("application/json", "text/plain", ""))
# W3C Trace Context: 32 lowercase hex digits, not all zero.
TRACE_ID_PATTERN = "^(?!0{32})[0-9a-f]{32}$"
# The beacon as /openapi.json documents it, written by the model that checks it
# (tracer/web/probe/beacon.py). The body is read raw, so FastAPI needs it spelled out.
_BEACON_SCHEMA = beacon_json_schema()
_ERROR_REF = {"application/json": {"schema": ERROR_SCHEMA}}
_OPENAPI = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _BEACON_SCHEMA},
                                                  "text/plain": {"schema": _BEACON_SCHEMA}}},
    "responses": {"202": {"description": "Accepted, joined or unmatched (no body)"},
                  **{str(status): {"description": text, "content": _ERROR_REF}
                     for status, text in ((400, "Not JSON"),
                                          (403, "Missing or wrong token or signature"),
                                          (413, "Too large"), (415, "Wrong media type"),
                                          (422, "Wrong shape or implausible"),
                                          (429, "Rate limited"))}}}



def make_probe_endpoint(*, store, metrics, span_builder=None, diagnoser=None,
                        signer: BeaconSigner | None = None,
                        max_bytes: int = DEFAULT_MAX_BYTES, rate_per_s: float = 20.0,
                        burst: int = 40, clock: Callable[[], float] = time.monotonic,
                        max_clients: int = 10_000, max_remote_joins: int = MAX_REMOTE_JOINS,
                        wall_clock_ns: Callable[[], int] = time.time_ns) -> ProbeEndpoint:
    """The beacon handler with its ingestor and per-client limiter, for the engine server,
    the proxy and the collector. With `signer` (what `build_observability` always passes), a
    beacon with a trace id must carry that trace's token; None skips the check (unit tests of
    the join).

    >>> from tracer.sinks.store import TraceStore
    >>> make_probe_endpoint(store=TraceStore(), metrics=None).max_bytes
    16384
    """
    return ProbeEndpoint(
        ProbeIngestor(store=store, metrics=metrics, span_builder=span_builder,
                      diagnoser=diagnoser, max_remote_joins=max_remote_joins),
        TokenBucketLimiter(rate_per_s, burst, max_keys=max_clients, clock=clock),
        metrics=metrics, max_bytes=max_bytes, signer=signer, wall_clock_ns=wall_clock_ns)


def probe_router(endpoint: ProbeEndpoint, *, path: str = "/v1/probe") -> APIRouter:
    """`POST path` served by `endpoint`. CORS is the app's (`tracer.web.cors`), as for every
    other path.

    >>> from fastapi import FastAPI
    >>> from tracer.sinks.store import TraceStore
    >>> app = FastAPI()
    >>> app.include_router(probe_router(make_probe_endpoint(store=TraceStore(), metrics=None)))
    """
    router = APIRouter()
    # A plain Response: the 202 has no body, and the document says so (no content type).
    router.add_api_route(path, endpoint.post, methods=["POST"], status_code=202,
                         response_class=Response, openapi_extra=_OPENAPI,
                         summary="A browser probe beacon")
    return router


def make_probe_router(*, path: str = "/v1/probe", **endpoint_options) -> APIRouter:
    """`probe_router(make_probe_endpoint(**endpoint_options))`: for a test or bench that
    mounts the endpoint and never reads its ingestor or limiter.

    >>> from fastapi import FastAPI
    >>> from tracer.sinks.store import TraceStore
    >>> app = FastAPI()
    >>> app.include_router(make_probe_router(store=TraceStore(), metrics=None))
    """
    return probe_router(make_probe_endpoint(**endpoint_options), path=path)


class ProbeEndpoint:
    """The beacon handler. Checks run cheapest first: rate limit (no body read), media type,
    size, schema, token. Every refusal is an OpenAI-shaped error with its own status."""

    def __init__(self, ingestor: ProbeIngestor, limiter: TokenBucketLimiter, *, metrics,
                 max_bytes: int, signer: BeaconSigner | None = None,
                 wall_clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.ingestor = ingestor
        self.wall_clock_ns = wall_clock_ns   # the age of in-band tokens
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
        server, refusal = self.authenticate(beacon)
        if refusal is not None:
            return refusal.response()
        self.count(self.ingestor.ingest(beacon, server))
        return Response(status_code=202)

    def authenticate(self, beacon) -> tuple[InbandTiming | None, OpenAIError | None]:
        """The beacon's checked in-band timing (or None), or the refusal, counted: a beacon
        is proven by its signed in-band timing or by its Server-Timing token. Also run on a
        beacon a collector relayed (tracer/collect/beacon_relay.py): it proves itself again."""
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
                return None, OpenAIError(403, str(exc), param="server",
                                         code="invalid_server_timing", type_="permission_error")
            stale = stale_token_error(server, beacon, self.wall_clock_ns())
            if stale is not None:
                self.count("rejected_signature")
                return None, OpenAIError(403, stale, param="server", code="stale_server_timing",
                                         type_="permission_error")
        elif (self.signer is not None and beacon.trace_id is not None
                and not self.signer.verify(beacon.trace_id, beacon.token)):
            # 403, not 401: the token is not an HTTP authentication scheme to retry with.
            self.count("rejected_token")
            missing = beacon.token is None
            return None, OpenAIError(
                403, "the beacon's token is missing: send the `beacon` desc of the response's "
                "Server-Timing header as `token`" if missing else
                "the beacon's token does not match its trace id", param="token",
                code="missing_beacon_token" if missing else "invalid_beacon_token",
                type_="permission_error")
        return server, None
