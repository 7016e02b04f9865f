"""OTLP/HTTP trace receiver: `POST /v1/traces`, as the OTLP specification's HTTP transport
says (opentelemetry-proto 1.x, "OTLP/HTTP"):

- bodies: `application/x-protobuf` or `application/json` (ids in hex), optionally
  `Content-Encoding: gzip`; the answer is an `ExportTraceServiceResponse` in the same
  encoding;
- bounded: the body as sent (`max_body_bytes`, else 413), the body decompressed
  (`max_decoded_bytes`, else 413, checked while inflating: a zip bomb stops at the limit),
  spans per export (`max_spans`, else 400), and what decoding may build: attributes, events
  and links per export and per span, counted before the message is built
  (`tracer.engines.otlp_bounds`, else 400 `too_many_attributes`);
- decoded off the loop: inflating and decoding run on a small pool
  (`tracer.web.otlp_decode`); when it is full, 503 with `Retry-After` (`overloaded`);
- malformed input (not the declared encoding, not an export) → 400 with a `google.rpc.Status`
  body (code 3, INVALID_ARGUMENT); an unsupported media type or encoding → 415; a wrong or
  missing bearer token, when one is configured → 401. Every answer is counted in
  `llm_otlp_receiver_requests_total{transport="http", outcome}`; the labels are closed.
- accepted: the bytes go to the tee (`tracer.web.otlp_forward`) unchanged, and what
  `read_export` takes from the message to `on_timings`, after the answer has been sent: by
  default the engine request spans among them (`tracer.engines.detect`), for the proxy's
  engine join; the collector takes every span and any relayed beacon
  (tracer/collect/beacon_relay.py). Reading the spans is Python work (~20 µs a span):
  it runs on the same pool, so a big export never holds the event loop that relays
  streams for more than a GIL switch interval at a time; only the match runs on the loop.

Engines send a token through `OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>`.
"""
from __future__ import annotations

import hmac
import zlib
from collections.abc import Callable

from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry, Counter

from tracer.engines.detect import engine_timings
from tracer.engines.spans import ExportLimits, MalformedOTLP, count_spans, spans_of
from tracer.web.openai_http import header_value
from tracer.web.otlp_decode import DecodePool, TooLarge, decode
from tracer.web.otlp_forward import OtlpForwarder

TRACES_PATH = "/v1/traces"
TRANSPORTS = ("http", "grpc")
RECEIVER_OUTCOMES = ("accepted", "malformed", "too_large", "too_many_spans", "unauthorized",
                     "unsupported", "method_not_allowed", "too_many_attributes", "overloaded",
                     "read_timeout")   # gRPC: no request message in time (otlp_grpc.py)
PROTOBUF, JSON = "application/x-protobuf", "application/json"
_INVALID_ARGUMENT, _UNAUTHENTICATED, _RESOURCE_EXHAUSTED, _UNIMPLEMENTED = 3, 16, 8, 12
_UNAVAILABLE = 14
_PROTOBUF_HEADERS = [(b"content-type", PROTOBUF.encode())]
_JSON_HEADERS = [(b"content-type", JSON.encode())]


def engine_request_spans(request: ExportTraceServiceRequest) -> list:
    """The default `read_export`: the export's engine request spans with their timing."""
    return engine_timings(spans_of(request))


class OtlpReceiver:
    """The ASGI app of `POST /v1/traces`.

    >>> r = OtlpReceiver(CollectorRegistry(), on_timings=None)
    >>> r.max_body_bytes, r.max_spans
    (4194304, 20000)
    """

    def __init__(self, registry: CollectorRegistry, *,
                 on_timings: Callable[[list], None] | None,
                 forwarder: OtlpForwarder | None = None, token: str | None = None,
                 max_body_bytes: int = 4 << 20, max_decoded_bytes: int = 16 << 20,
                 max_spans: int = 20_000,
                 read_export: Callable[[ExportTraceServiceRequest], object] | None = None
                 ) -> None:
        # Called on the event loop with what `read_export` returned for the export (by
        # default its (span, EngineTiming) pairs); None: the spans are only forwarded.
        self.on_timings = on_timings
        # Runs on the decode pool, never on the loop.
        self.read_export = read_export or engine_request_spans
        self.forwarder = forwarder
        self.expected = f"Bearer {token}".encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.max_decoded_bytes = max_decoded_bytes
        self.max_spans = max_spans
        self.pool = DecodePool()
        requests = Counter("llm_otlp_receiver_requests_total", "OTLP trace exports received, "
                           "by transport (http, grpc) and outcome", ("transport", "outcome"),
                           registry=registry)
        self._outcomes = {(t, o): requests.labels(t, o) for t in TRANSPORTS
                          for o in RECEIVER_OUTCOMES}
        self._outcome = {o: self._outcomes["http", o] for o in RECEIVER_OUTCOMES}
        self._spans = Counter("llm_otlp_receiver_spans_total", "Spans in accepted OTLP "
                              "trace exports", registry=registry)

    def count(self, transport: str, outcome: str) -> None:
        self._outcomes[transport, outcome].inc()

    def accepted(self, transport: str, body: bytes, content_type: str,
                 content_encoding: str | None, num_spans: int) -> None:
        """An export was answered with success (on the event loop): count it, tee its bytes."""
        self._outcomes[transport, "accepted"].inc()
        self._spans.inc(num_spans)
        if self.forwarder is not None:
            self.forwarder.submit(body, content_type, content_encoding)

    def deliver(self, found) -> None:
        """The engine request spans of an accepted export, to the join (on the event loop)."""
        if found and self.on_timings is not None:
            self.on_timings(found)

    async def __call__(self, scope, receive, send) -> None:
        if scope["method"] != "POST":
            return await self._status(send, "method_not_allowed", 405, _UNIMPLEMENTED,
                                      "only POST is served here", PROTOBUF,
                                      extra=[(b"allow", b"POST")])
        content_type = _media_type(header_value(scope, b"content-type"))
        reply_type = JSON if content_type == JSON else PROTOBUF
        if self.expected is not None and not hmac.compare_digest(
                header_value(scope, b"authorization") or b"", self.expected):
            return await self._status(send, "unauthorized", 401, _UNAUTHENTICATED,
                                      "missing or wrong bearer token", reply_type,
                                      extra=[(b"www-authenticate", b'Bearer realm="otlp"')])
        encoding = (header_value(scope, b"content-encoding") or b"identity").decode(
            "latin-1").strip().lower()
        if content_type not in (PROTOBUF, JSON) or encoding not in ("identity", "gzip"):
            return await self._status(send, "unsupported", 415, _INVALID_ARGUMENT,
                                      "send application/x-protobuf or application/json, "
                                      "identity or gzip", reply_type)
        body = await _read_body(scope, receive, self.max_body_bytes)
        if body is _GONE:
            return   # the exporter went away mid-body: nothing was received, nobody to answer
        if body is None:
            return await self._status(send, "too_large", 413, _RESOURCE_EXHAUSTED,
                                      f"body exceeds {self.max_body_bytes} bytes", reply_type)
        if not self.pool.try_enter():
            return await self._status(send, "overloaded", 503, _UNAVAILABLE,
                                      "too many exports are being decoded; retry later",
                                      reply_type, extra=[(b"retry-after", b"1")])
        try:
            await self._decode(send, body, content_type, encoding, reply_type)
        finally:
            self.pool.leave()

    async def _decode(self, send, body: bytes, content_type: str, encoding: str,
                      reply_type: str) -> None:
        try:
            request = await self.pool.run(decode, body, content_type, encoding,
                                          self.max_decoded_bytes,
                                          ExportLimits(max_spans=self.max_spans))
        except TooLarge:
            return await self._status(send, "too_large", 413, _RESOURCE_EXHAUSTED,
                                      f"body inflates past {self.max_decoded_bytes} bytes",
                                      reply_type)
        except zlib.error:
            return await self._status(send, "malformed", 400, _INVALID_ARGUMENT,
                                      "the body is not valid gzip", reply_type)
        except MalformedOTLP as exc:   # its outcome: malformed, too_many_{spans,attributes}
            return await self._status(send, exc.outcome, 400, _INVALID_ARGUMENT, str(exc),
                                      reply_type)
        num_spans = count_spans(request)
        if num_spans > self.max_spans:
            return await self._status(send, "too_many_spans", 400, _INVALID_ARGUMENT,
                                      f"{num_spans} spans in one export; at most "
                                      f"{self.max_spans}", reply_type)
        ok = ExportTraceServiceResponse()
        await _answer(send, 200, b"{}" if reply_type == JSON else ok.SerializeToString(),
                      _JSON_HEADERS if reply_type == JSON else _PROTOBUF_HEADERS)
        self.accepted("http", body, reply_type, None if encoding == "identity" else encoding,
                      num_spans)
        if self.on_timings is not None:
            self.deliver(await self.pool.run(self.read_export, request))

    async def _status(self, send, outcome: str, http_status: int, code: int, message: str,
                      reply_type: str, extra: list | None = None) -> None:
        self._outcome[outcome].inc()
        status = Status(code=code, message=message)
        if reply_type == JSON:
            from google.protobuf.json_format import MessageToJson
            body, headers = MessageToJson(status).encode(), _JSON_HEADERS
        else:
            body, headers = status.SerializeToString(), _PROTOBUF_HEADERS
        await _answer(send, http_status, body, headers + (extra or []))


def _media_type(raw: bytes | None) -> str:
    """
    >>> _media_type(b"application/JSON; charset=utf-8"), _media_type(None)
    ('application/json', '')
    """
    return (raw or b"").split(b";")[0].strip().lower().decode("latin-1")


_GONE = object()


async def _read_body(scope, receive, limit: int):
    """The body; None once it passes `limit` (the rest is not read); `_GONE` when the client
    disconnected before it ended."""
    declared = header_value(scope, b"content-length") or b""
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _GONE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send, status: int, body: bytes, headers: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
