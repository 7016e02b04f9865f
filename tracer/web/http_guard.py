"""uvicorn's httptools protocol with the connection limits of `tracer.web.limits` (that
module's docstring says what each limit does and why uvicorn needs the help), and each
request's writes through `tracer.web.write_batch` (offered to the app as a scope extension)."""
from __future__ import annotations

import json
import time

from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from tracer.web.limits import ConnectionLimits
from tracer.web.openai_http import OpenAIError
from tracer.web.write_batch import WRITE_BATCH, BatchingTransport

_IDLE, _HEAD, _BODY = 0, 1, 2
# Each header field costs ": " and CRLF on the wire beyond its name and value.
_FIELD_OVERHEAD_BYTES = 4
# The OTLP receiver's path (tracer/web/otlp_receiver.py, TRACES_PATH; not imported: the
# engine serves no receiver): its refusals take the OTLP/HTTP error shape, a
# google.rpc.Status in the request's encoding, with the gRPC code of the HTTP status.
_OTLP_PATH = b"/v1/traces"
_GRPC_CODE = {408: 4, 503: 14}   # DEADLINE_EXCEEDED, UNAVAILABLE
# A connection becomes stalled only after `reclaim_after_s` (1 s by default): a pass that
# found none is good for a tenth of that.
_NO_STALLED_RECHECK_S = 0.1


def _error_response(status: int, message: str, code: str, type_: str,
                    default_headers, extra: tuple = ()) -> bytes:
    body = json.dumps(OpenAIError(status, message, code=code, type_=type_).body()).encode()
    head = [STATUS_LINE[status]]
    for name, value in (*default_headers, *extra):
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: application/json\r\ncontent-length: ",
             str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]
    return b"".join(head)


def _otlp_error_response(status: int, message: str, as_json: bool, default_headers,
                         extra: tuple = ()) -> bytes:
    """OTLP/HTTP's error answer: a google.rpc.Status, protobuf or (for a JSON export) JSON.

    >>> _otlp_error_response(408, "late", True, ()).endswith(b'{"code": 4, "message": "late"}')
    True
    """
    code = _GRPC_CODE.get(status, 2)   # UNKNOWN
    if as_json:
        body, media = json.dumps({"code": code, "message": message}).encode(), b"application/json"
    else:
        from google.rpc.status_pb2 import Status  # only for a refused export
        body = Status(code=code, message=message).SerializeToString()
        media = b"application/x-protobuf"
    head = [STATUS_LINE[status]]
    for name, value in (*default_headers, *extra):
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: ", media, b"\r\ncontent-length: ", str(len(body)).encode(),
             b"\r\nconnection: close\r\n\r\n", body]
    return b"".join(head)


class _CloseIfBodyOwed(RequestResponseCycle):
    """uvicorn's cycle, except that a response started before the request body has all
    arrived closes the connection: uvicorn would keep it and read (and drop) the rest of
    the body, as slowly as the client sends it. `keep_alive` is read once the response has
    started (for the `Connection` header) and once it is complete (to close or keep): the
    first read decides, so the head and the close agree."""

    @property
    def keep_alive(self) -> bool:
        state = self.__dict__
        if state["keep_alive"] and self.more_body and self.response_started:
            state["keep_alive"] = False
        return state["keep_alive"]

    @keep_alive.setter
    def keep_alive(self, value: bool) -> None:
        self.__dict__["keep_alive"] = value


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; `limits` is set per server by
    `guarded_protocol_class`."""

    limits: ConnectionLimits = ConnectionLimits()
    # Per server (each gets its own class): no stalled connection was found at the cap, so
    # none is looked for again before this time.
    _no_stalled_until = 0.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _IDLE
        self._messages = 0
        self._head_bytes = 0
        self._refused = False
        self._over_capacity = False
        self._timer = None
        self._last_body_s = 0.0
        self._body_deadline_s = 0.0
        # The current wait on the client (connected, or the last response done): since when,
        # and the bytes it sent meanwhile; what `stalled` judges progress by.
        self._wait_since_s = 0.0
        self._wait_bytes = 0

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._wait_since_s = time.monotonic()
        if len(self.connections) > self.limits.max_connections:
            self._over_capacity = not self._make_room()
        # uvicorn arms no timer before the first byte: a silent connection would stay forever.
        self._arm(self.limits.header_timeout_s, self._header_timed_out)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._wait_bytes += len(data)
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
            self._last_body_s = now = time.monotonic()
            if self._timer is None:   # the first check due: the gap or the deadline
                self._arm(min(now + self.limits.body_timeout_s, self._body_deadline_s) - now,
                          self._body_timed_out)

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
        self._body_deadline_s = time.monotonic() + self.limits.body_deadline_s
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
            cycle.__class__ = _CloseIfBodyOwed
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

    def on_response_complete(self) -> None:
        self._wait_since_s, self._wait_bytes = time.monotonic(), 0   # waiting for the next
        super().on_response_complete()

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
        now, gap_s = time.monotonic(), self.limits.body_timeout_s
        if self._waiting_for_us():
            # The app is not reading (its buffer is full, or the client waits for our
            # 100 Continue until it does): neither clock runs against the client.
            self._last_body_s = now
            self._body_deadline_s = max(self._body_deadline_s, now + gap_s)
            return self._arm(min(gap_s, 1.0), self._body_timed_out)
        if now >= self._body_deadline_s:
            reason = (f"the request body did not arrive within {self.limits.body_deadline_s:g} s"
                      " (the deadline for a whole body)")
        elif now - self._last_body_s >= gap_s:
            reason = f"no request body byte for {gap_s:g} s"
        else:   # a byte came since, and the deadline is ahead: the client is not late
            return self._arm(min(self._last_body_s + gap_s, self._body_deadline_s) - now,
                             self._body_timed_out)
        self._cut(reason)

    def _waiting_for_us(self) -> bool:
        return self.flow.read_paused or (
            self.cycle is not None and self.cycle.waiting_for_100_continue)

    def _cut(self, reason: str) -> None:
        """408 for the request being received, or a bare close when there is none to
        answer (idle between requests) or its response has started (the app sees
        http.disconnect)."""
        if self._phase == _HEAD or (self._phase == _BODY and (
                self.cycle is None or not self.cycle.response_started)):
            self._refuse(408, reason, "request_timeout", "invalid_request_error")
        else:
            self._refused = True
            self._disarm()
            self.transport.close()

    # -- the connection cap ---------------------------------------------------------------
    def stalled(self, now: float) -> bool:
        """Waiting on its client (for a request, its head or its body) for at least
        `reclaim_after_s`, having sent under `min_rate_bytes_per_s` meanwhile: what a
        connection at the cap may reclaim. A request the app is working on, or whose body
        the server is not reading, is never stalled."""
        waited_s = now - self._wait_since_s
        if (waited_s < self.limits.reclaim_after_s or self._refused
                or self._wait_bytes >= self.limits.min_rate_bytes_per_s * waited_s
                or self.transport.is_closing()):
            return False
        if self._phase == _HEAD:
            return True
        if self._phase == _BODY:
            return not self._waiting_for_us()
        return self.cycle is None or self.cycle.response_complete   # between requests

    def _make_room(self) -> bool:
        """This connection is over the cap: True once a stalled connection was reclaimed
        for it. The first one found goes: every stalled connection is fair game, and under
        attack, when most are, the pass stops at once. A pass that finds none is not
        repeated for `_NO_STALLED_RECHECK_S`, so at a cap full of busy requests each
        newcomer gets its 503 without a pass over them all (bench/slow_clients.py measures
        the pass)."""
        now, cls = time.monotonic(), type(self)
        if now < cls._no_stalled_until:
            return False
        for other in self.connections:
            if other is not self and other.stalled(now):
                other._cut(f"this server is at its connection limit, and this connection sent "
                           f"{other._wait_bytes} bytes in {now - other._wait_since_s:.1f} s "
                           f"(under {self.limits.min_rate_bytes_per_s:g} bytes/s): it was "
                           "closed for another")
                return True
        cls._no_stalled_until = now + _NO_STALLED_RECHECK_S
        return False

    # -- refusals -------------------------------------------------------------------------
    def _refuse_head_too_large(self) -> None:
        self._refuse(431, f"request line and headers exceed {self.limits.max_header_bytes} "
                     "bytes", "request_header_fields_too_large", "invalid_request_error")

    def _refuse(self, status: int, message: str, code: str, type_: str,
                extra: tuple = ()) -> None:
        self._refused = True
        self._disarm()
        if self._phase == _BODY and self.url.split(b"?", 1)[0] == _OTLP_PATH:
            media = next((v for n, v in self.headers if n == b"content-type"), b"")
            as_json = media.split(b";")[0].strip().lower() == b"application/json"
            response = _otlp_error_response(status, message, as_json,
                                            self.server_state.default_headers, extra)
        else:
            response = _error_response(status, message, code, type_,
                                       self.server_state.default_headers, extra)
        self.transport.write(response)
        self.transport.close()


def guarded_protocol_class(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class carrying `limits`, for uvicorn's `http=` option."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
