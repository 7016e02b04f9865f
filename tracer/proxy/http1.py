"""One keep-alive HTTP/1.1 client connection: the proxy's data plane to its upstream.

An `asyncio.Protocol` fed to llhttp (httptools): `data_received` parses in place, body bytes
wait in a list, and the relay takes everything buffered in one call. There is no task,
lock, generator or timeout context per chunk, which is what made the first, httpx-based
relay cost 0.5 ms of CPU per relayed SSE event and 1-1.5 ms per request before the first
upstream byte (`bench/proxy_overhead.py`; docs/deployment.md, "How the proxy stays within a
millisecond of nginx").

It raises the connection's errors (`tracer.proxy.upstream_errors`: `UpstreamClosed`,
`UpstreamTimeout`, `UpstreamProtocolError`); what a client gets for each is decided by
`tracer.proxy.upstream`.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httptools

from tracer.proxy.upstream_errors import (
    UpstreamClosed,
    UpstreamClosedBeforeSend,
    UpstreamError,
    UpstreamHeadTooLarge,
    UpstreamProtocolError,
    UpstreamTimeout,
)

# A client that reads slower than the upstream writes: stop reading from the upstream
# (TCP backpressure) once this much body waits, instead of buffering without bound.
DEFAULT_MAX_BUFFER_BYTES = 1 << 20
# An upstream's response head (status line, headers, any 1xx heads before it) is held whole
# until it ends, so it is bounded like the client's request head (tracer/web/limits.py):
# nginx refuses a head over its 4-8 KiB proxy buffer ("upstream sent too big header"); vLLM,
# SGLang and TGI answer with a few hundred bytes. Past either bound the answer is a 502.
DEFAULT_MAX_HEAD_BYTES = 64 << 10
DEFAULT_MAX_HEADERS = 256
_FIELD_OVERHEAD_BYTES = 4   # ": " and CRLF around each header field
_NO_BODY_STATUSES = frozenset((204, 304))


class _HeadLimit(Exception):
    """Raised inside llhttp's header callback to stop the parser at the limit."""


class _UnrequestedResponse(Exception):
    """A second response began in the bytes after ours."""


@dataclass(slots=True, frozen=True)
class ResponseHead:
    """Status line and headers as received (names in the upstream's own case).

    >>> ResponseHead(200, [(b"Content-Type", b"text/event-stream")], 0).header(b"content-type")
    b'text/event-stream'
    """

    status: int
    headers: list[tuple[bytes, bytes]]
    received_ns: int

    def header(self, lower_name: bytes) -> bytes | None:
        for name, value in self.headers:
            if name.lower() == lower_name:
                return value
        return None


class Http1Connection(asyncio.Protocol):
    """One connection; one request at a time (no pipelining).

    Inside a coroutine::

        _, conn = await loop.create_connection(Http1Connection, "127.0.0.1", port)
        conn.start(b"GET / HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n")
        head = await conn.read_head(timeout_s=5)
        while body := await conn.read_body(timeout_s=5):
            ...
    """

    def __init__(self, *, clock_ns: Callable[[], int] = time.perf_counter_ns,
                 max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
                 max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
                 max_headers: int = DEFAULT_MAX_HEADERS,
                 on_lost: Callable[[Http1Connection], None] | None = None) -> None:
        self.clock_ns = clock_ns
        self.max_buffer_bytes = max_buffer_bytes
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.on_lost = on_lost   # told once the connection is gone, whoever closed it
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False
        self.idle_since_s = time.monotonic()
        self.num_requests = 0
        self.last_data_ns = 0            # when the newest bytes arrived (for the stage marks)
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None   # the read timeout's (see `_wait`)
        self._sink: Callable[[bytes], bool] | None = None   # see `push_body`
        self._sink_error: BaseException | None = None
        self._push_timeout_s: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0             # head bytes received so far, 1xx heads included
        self._head: ResponseHead | None = None
        self.overran = False             # bytes came after the response's declared end
        self._body: list[bytes] = []
        self._num_body_bytes = 0
        self._complete = False
        self._keep_alive = False
        self._close_delimited = False
        self._no_body = False
        self._error: UpstreamError | None = None
        self._received_any = False
        self._waiter: asyncio.Future | None = None
        self._deadline_s: float | None = None   # loop time by which the next byte is due
        self._paused = False
        self._sink = None

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_data_ns = self.clock_ns()
        if not self.busy or self._complete:
            # Bytes nobody asked for (e.g. a late error on an idle keep-alive connection):
            # this connection's framing can no longer be trusted, so it is not reused. While
            # a response is still being relayed they say that it ran past its declared end.
            self.overran = self.busy
            self.abort()
            return
        self._received_any = True
        head_pending = self._head is None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._complete:
                # More bytes followed the response in the same read (`on_message_begin`
                # stopped the parser): not ours to relay, and the framing is lost.
                self._keep_alive = False
                self.overran = True
            elif self._head_bytes > self.max_head_bytes or len(self._headers) > self.max_headers:
                self._head_too_large()
            else:
                self._fail(UpstreamProtocolError(f"malformed upstream response: {exc}",
                                                 received_any=True))
                self.abort()
        if head_pending and self._head is None and self._error is None:
            # A head that never ends (one endless header line calls no callback): bounded
            # by the bytes received before it.
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._head_too_large()
        sink = self._sink
        if sink is not None and self._body and not self._complete and self._error is None:
            # `push_body`'s hand-over, inline: this runs once per upstream read.
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body.clear()
            self._num_body_bytes = 0
            timeout_s = self._push_timeout_s
            if timeout_s is not None:
                self._deadline_s = self._loop.time() + timeout_s   # the timer re-arms to it
            try:
                if sink(body):
                    return
                self._body.append(body)   # not taken: it waits for `read_body`, as it would have
                self._num_body_bytes = len(body)
            except BaseException as exc:   # raised in the caller's task, by `push_body`
                self._sink_error = exc
            self._sink = None
            self._wake()
            return
        if self._num_body_bytes > self.max_buffer_bytes and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._waiter   # `_wake`, inline: this runs once per upstream read
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> bool:
        return False   # close our side too: a half-closed upstream answers nothing more

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_lost is not None:
            self.on_lost(self)
        if self.busy and not self._complete:
            if self._head is not None and self._close_delimited and exc is None:
                self._complete = True   # the body ran to a clean close, as its framing says
            else:
                self._fail(UpstreamClosed(
                    "the upstream closed the connection" + (f" ({exc})" if exc else ""),
                    received_any=self._received_any))
        self._wake()

    # --- llhttp callbacks (called from feed_data) ---------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            raise _UnrequestedResponse()   # stops llhttp before it touches our response

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._head_bytes += len(name) + len(value) + _FIELD_OVERHEAD_BYTES
        if self._head_bytes > self.max_head_bytes or len(self._headers) > self.max_headers:
            raise _HeadLimit()

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:    # 1xx interim response: the real one follows (its bytes count)
            self._headers = []
            return
        head = ResponseHead(status, self._headers, self.last_data_ns)
        self._head = head
        self._keep_alive = self._parser.should_keep_alive()
        framed = (head.header(b"content-length") is not None
                  or head.header(b"transfer-encoding") is not None)
        self._close_delimited = not framed and not self._no_body and status not in _NO_BODY_STATUSES
        if self._no_body:                  # HEAD: no body follows, whatever it declares
            self._complete = True
            self._keep_alive = False       # llhttp would wait for the declared body

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._num_body_bytes += len(body)

    def on_message_complete(self) -> None:
        if self._head is not None:
            self._complete = True

    # --- the client side ----------------------------------------------------------------

    def start(self, request: bytes, *, no_body: bool = False) -> None:
        """Send one request (head and body in `request`); `no_body` for a HEAD request.

        Raises `UpstreamClosedBeforeSend`, writing nothing, on a connection already seen
        closing (the upstream's FIN processed, `connection_lost` not yet run)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamClosedBeforeSend("the upstream had closed the connection before "
                                           "the request was sent")
        self._reset()
        self._no_body = no_body
        self.busy = True
        self.num_requests += 1
        self.transport.write(request)

    async def read_head(self, timeout_s: float | None) -> ResponseHead:
        while self._head is None:
            if self._error is not None:
                raise self._error
            await self._wait(timeout_s)
        return self._head

    async def read_body(self, timeout_s: float | None) -> bytes:
        """Every body byte received since the last call; b"" once the response is complete.

        Raises the connection's error when the body is cut, times out, or is malformed.
        """
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            await self._wait(timeout_s)
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._num_body_bytes = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return body

    async def push_body(self, sink: Callable[[bytes], bool], timeout_s: float | None) -> None:
        """Hand each body read to `sink` from `data_received` itself, as it arrives, instead
        of waking a reader for it; return when `read_body` has something to say: body bytes
        the sink did not take, the end of the body, or an error (which it then raises).

        `sink(body)` is called with all the body bytes of one upstream read and returns
        True when it took them; False leaves them to `read_body` and stops the pushing (its
        consumer is full: the caller waits for it in its own task). It is never given the response's
        last read: that one, and a read that finds the body already buffered, are left to
        `read_body`, so the caller ends the body in its own task, right after its last
        bytes. An exception from `sink` is raised here. The read timeout bounds each gap
        between reads, as in `read_body`.

        nginx relays an unbuffered response the same way: the upstream connection's read
        handler writes to the client at once (ngx_http_upstream_process_non_buffered_request),
        with no other task woken per read. Here it saves, per read, the future a reader
        waits on, the task step it schedules and the coroutine frames it resumes.
        """
        if self._body or self._complete or self._error is not None:
            return
        self._sink, self._push_timeout_s = sink, timeout_s
        try:
            await self._wait(timeout_s)
        finally:
            self._sink = None
        error, self._sink_error = self._sink_error, None
        if error is not None:
            raise error

    @property
    def complete(self) -> bool:
        return self._complete and self._error is None

    @property
    def at_end(self) -> bool:
        """The response arrived whole and `read_body` returned all of it."""
        return self._complete and self._error is None and not self._body

    @property
    def has_body_bytes(self) -> bool:
        """Body bytes have arrived that `read_body` has not returned yet."""
        return bool(self._body)

    def finish(self) -> bool:
        """Done with this response: True when the connection can serve another request."""
        reusable = (self._complete and self._error is None and self._keep_alive
                    and not self._body and not self.closed)
        self.busy = False
        self.idle_since_s = time.monotonic()
        self._cancel_timer()
        if not reusable:
            self.abort()
        return reusable

    def abort(self) -> None:
        """Drop the connection now (the upstream sees a reset: the request is cancelled)."""
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    # --- waiting ------------------------------------------------------------------------

    async def _wait(self, timeout_s: float | None) -> None:
        # One timer per connection, moved by a store: a stream waits once per event, and a
        # timer armed and cancelled per wait was a measurable part of relaying one
        # (bench/proxy_overhead.py). The timer fires at the earliest deadline it was armed
        # for and re-arms itself for the latest one.
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        if timeout_s is None:
            self._deadline_s = None
        else:
            self._deadline_s = loop.time() + timeout_s
            if self._timer is None:
                self._timer = loop.call_at(self._deadline_s, self._check_deadline)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_deadline(self) -> None:
        self._timer = None
        waiter, deadline_s = self._waiter, self._deadline_s
        if waiter is None or waiter.done() or deadline_s is None:
            return
        if self._loop.time() < deadline_s:
            self._timer = self._loop.call_at(deadline_s, self._check_deadline)
            return
        self._error = UpstreamTimeout("the upstream sent nothing within the read timeout",
                                      received_any=self._received_any)
        waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error

    def _head_too_large(self) -> None:
        self._fail(UpstreamHeadTooLarge(
            f"the upstream's response head exceeds {self.max_head_bytes} bytes or "
            f"{self.max_headers} header fields", received_any=True))
        self._headers = []   # what was held goes now, not when the connection is collected
        self.abort()
