"""HTTP pieces every OpenAI-compatible front of ours shares: the error shape, a bounded body
read, and which trace context a request's own span should continue."""
from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from tracer.otel import current_traceparent


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


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The body, or a 413 as soon as it is known to exceed the limit (header or bytes read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise OpenAIError(413, f"request body of {declared} bytes exceeds the limit of "
                          f"{limit_bytes} bytes", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise OpenAIError(413, f"request body exceeds the limit of {limit_bytes} bytes",
                              code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parent_traceparent(request: Request) -> str | None:
    """The HTTP server span (FastAPI instrumentation) when there is one, else the header."""
    return current_traceparent() or request.headers.get("traceparent")
