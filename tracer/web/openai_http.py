"""HTTP pieces every OpenAI-compatible front of ours shares: the error shape, a bounded body
read, and the trace context a request arrived with, parsed once into a `TraceParent`.

No exporter here (no OTel, no sink; a contract in .importlinter holds it): the errors are
imported by every front and tool, and an enclosing HTTP span is the span exporter's
business (tracer.sinks.server_span.continued_parent)."""
from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from tracer.record.traceparent import TraceParent, parse_traceparent

# `OpenAIError.body()` as JSON Schema, for the OpenAPI documents both fronts publish.
# nginx's "client closed request": the status of a request whose client left before an
# answer; recorded (logs, traces), never read by anyone.
CLIENT_CLOSED_REQUEST = 499

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}}}},
}


class OpenAIError(Exception):
    """An error answered in the OpenAI shape: {"error": {message, type, param, code}}.

    >>> OpenAIError(413, "too big", code="request_too_large").response().status_code
    413
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def sse_event(self, *, after_partial_event: bool = False) -> bytes:
        """The error as one in-band SSE event, for a stream whose headers already left.
        After a partial event, a blank line first ends it, so the error is its own event.

        >>> OpenAIError(502, "gone", code="upstream", type_="upstream_error").sse_event()
        b'data: {"error": {"message": "gone", "type": "upstream_error", "param": null, "code": "upstream"}}\\n\\n'
        """
        event = ("data: " + json.dumps(self.body()) + "\n\n").encode()
        return b"\n\n" + event if after_partial_event else event


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The body, or a 413 as soon as it is known to exceed the limit (header or bytes read)."""
    return await read_asgi_body(request.scope, request.receive, limit_bytes)


async def read_asgi_body(scope: dict, receive, limit_bytes: int) -> bytes:
    """`read_body` on a raw ASGI request (the proxy's hot path has no Starlette Request)."""
    declared = header_value(scope, b"content-length") or b""
    if declared.isdigit() and int(declared) > limit_bytes:
        raise OpenAIError(413, f"request body of {declared.decode()} bytes exceeds the limit "
                          f"of {limit_bytes} bytes", code="request_too_large")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise OpenAIError(413, f"request body exceeds the limit of {limit_bytes} bytes",
                              code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def header_value(scope: dict, lower_name: bytes) -> bytes | None:
    """The first value of a request header in an ASGI scope (names are lower-case there).

    >>> header_value({"headers": [(b"traceparent", b"00-ab")]}, b"traceparent")
    b'00-ab'
    """
    for name, value in scope["headers"]:
        if name == lower_name:
            return value
    return None


def parent_traceparent(request: Request) -> TraceParent | None:
    """The request's `traceparent` header, parsed; None when absent or invalid (the request
    then starts a new trace: W3C Trace Context, "Processing Model")."""
    return parent_traceparent_of(request.scope)


def parent_traceparent_of(scope: dict) -> TraceParent | None:
    """`parent_traceparent` on a raw ASGI scope.

    >>> parent_traceparent_of({"headers": [(b"traceparent",
    ...     b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]}).span_id
    '00f067aa0ba902b7'
    >>> parent_traceparent_of({"headers": [(b"traceparent", b"garbage")]}) is None
    True
    """
    header = header_value(scope, b"traceparent")
    return None if header is None else parse_traceparent(header.decode("latin-1"))


def bounded_int(text: str, param: str, low: int, high: int) -> int:
    """A query parameter as an int in [low, high], else a 400 in the OpenAI error shape
    (FastAPI's own validation would answer a 422 in its own shape).

    >>> bounded_int("7", "limit", 1, 10)
    7
    >>> bounded_int("0x7", "limit", 1, 10)
    Traceback (most recent call last):
    tracer.web.openai_http.OpenAIError: limit must be an integer from 1 to 10, got '0x7'
    """
    value = None
    if 0 < len(text) <= 6 and text.isascii() and text.isdigit():
        value = int(text)
    if value is None or not low <= value <= high:
        raise OpenAIError(400, f"{param} must be an integer from {low} to {high}, got "
                          f"{text[:20]!r}", param=param, code="invalid_value")
    return value
