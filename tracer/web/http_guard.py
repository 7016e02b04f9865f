"""uvicorn's httptools protocol with the connection limits of `tracer.web.limits` (that
module's docstring says what each limit does and why uvicorn needs the help), and each
request's writes through `tracer.web.write_batch` (offered to the app as a scope extension)."""
from __future__ import annotations

import json
import time

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from tracer.web.limits import ConnectionLimits
from tracer.web.openai_http import OpenAIError
from tracer.web.write_batch import WRITE_BATCH, BatchingTransport

_IDLE, _HEAD, _BODY = 0, 1, 2
# Each header field costs ": " and CRLF on the wire beyond its name and value.
_FIELD_OVERHEAD_BYTES = 4


def _error_response(status: int, message: str, code: str, type_: str,
                    default_headers, extra: tuple = ()) -> bytes:
    body = json.dumps(OpenAIError(status, message, code=code, type_=type_).body()).encode()
    head = [STATUS_LINE[status]]
    for name, value in (*default_headers, *extra):
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: application/json\r\ncontent-length: ",
             str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]
    return b"".join(head)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; `limits` is set per server by
    `guarded_protocol_class`."""

    limits: ConnectionLimits = ConnectionLimits()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _IDLE
        self._messages = 0
        self._head_bytes = 0
        self._refused = False
        self._over_capacity = False
        self._timer = None
        self._last_body_s = 0.0

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._over_capacity = len(self.connections) > self.limits.max_connections
        # uvicorn arms no timer before the first byte: a silent connection would stay forever.
        self._arm(self.limits.header_timeout_s, self._header_timed_out)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        messages = self._messages
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._phase == _HEAD:
            if self._messages == messages:   # the whole read was this head's
                self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                return self._refuse_head_too_large()
            if self._timer is None:
                self._arm(self.limits.header_timeout_s, self._header_timed_out)
        elif self._phase == _BODY:
            self._last_body_s = time.monotonic()
            if self._timer is None:
                self._arm(self.limits.body_timeout_s, self._body_timed_out)

    # -- parser callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase, self._head_bytes = _HEAD, 0
        self._messages += 1

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._phase = _BODY
        size = len(self.url) + sum(len(n) + len(v) + _FIELD_OVERHEAD_BYTES
                                   for n, v in self.headers)
        if size > self.limits.max_header_bytes:
            return self._refuse_head_too_large()
        if self._over_capacity:
            return self._refuse(503, f"this server already holds {self.limits.max_connections}"
                                " connections; retry shortly", "too_many_connections",
                                "server_error", ((b"retry-after", b"1"),))
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:   # a new request's cycle
            batching = BatchingTransport(self.transport, self.loop)
            cycle.transport = batching
            self.scope.setdefault("extensions", {})[WRITE_BATCH] = {"hold": batching.hold}

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._phase = _IDLE
        super().on_message_complete()

    # -- timers ---------------------------------------------------------------------------
    def _arm(self, delay_s: float, callback) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._phase == _HEAD:
            self._refuse(408, f"the request head did not arrive within "
                         f"{self.limits.header_timeout_s:g} s", "request_timeout",
                         "invalid_request_error")
        elif self._phase == _IDLE and self._messages == 0:
            self.transport.close()   # connected, sent nothing: no request to answer

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._phase != _BODY:
            return
        idle_s = time.monotonic() - self._last_body_s
        waiting_for_us = self.flow.read_paused or (
            self.cycle is not None and self.cycle.waiting_for_100_continue)
        if waiting_for_us or idle_s < self.limits.body_timeout_s:
            # The app is not reading (its buffer is full, or the client waits for our
            # 100 Continue until it does), or a byte came since: the client is not late.
            return self._arm(max(self.limits.body_timeout_s - idle_s, 0.05),
                             self._body_timed_out)
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(408, f"no request body byte for {self.limits.body_timeout_s:g} s",
                         "request_timeout", "invalid_request_error")
        else:
            self._refused = True
            self.transport.close()   # the app sees http.disconnect

    # -- refusals -------------------------------------------------------------------------
    def _refuse_head_too_large(self) -> None:
        self._refuse(431, f"request line and headers exceed {self.limits.max_header_bytes} "
                     "bytes", "request_header_fields_too_large", "invalid_request_error")

    def _refuse(self, status: int, message: str, code: str, type_: str,
                extra: tuple = ()) -> None:
        self._refused = True
        self._disarm()
        self.transport.write(_error_response(status, message, code, type_,
                                             self.server_state.default_headers, extra))
        self.transport.close()


def guarded_protocol_class(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class carrying `limits`, for uvicorn's `http=` option."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
