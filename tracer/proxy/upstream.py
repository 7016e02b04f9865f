"""The proxy's side of the upstream hop: a keep-alive connection pool, one exchange per
request, header hygiene, and the times the request flow names its stages by.

An exchange reports `handed_ns`, the instant the request was handed to a connection's
transport (stamped just before the write; a pooled connection at once, a new one after its
TCP connect, whose time is `connect_ns`), and the response head's `received_ns`;
`tracer.proxy.serving` turns them into the `upstream_connect` and `upstream_ttfb` marks.
Connections come from `tracer.proxy.http1`; which client status each failure becomes is
decided here: refused or broken before any answer is a 502, no answer within the read
timeout a 504.
"""
from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tracer.proxy.http1 import Http1Connection, ResponseHead
from tracer.proxy.upstream_errors import (
    UpstreamClosedBeforeSend,
    UpstreamError,
    UpstreamFailure,
    UpstreamTimeout,
)
from tracer.record.errors import TIMEOUT, UPSTREAM, UPSTREAM_UNAVAILABLE


@dataclass(slots=True, frozen=True)
class UpstreamLimits:
    """Timeouts and pool size of the upstream connections.

    `read_timeout_s` bounds the wait for the response headers and every gap between body
    chunks (`READ_TIMEOUT_S`, the CLI's `--read-timeout-s`, says why 300 s).

    >>> UpstreamLimits(read_timeout_s=30.0).connect_timeout_s
    5.0
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0   # READ_TIMEOUT_S
    pool_timeout_s: float = 30.0         # waiting for a free slot when all are busy
    max_connections: int = 512
    max_idle_connections: int = 128
    # Idle connections unused this long are not reused: under the shortest common upstream
    # keep-alive (uvicorn's 5 s, so vLLM's and SGLang's), so the proxy stops using a
    # connection before the upstream closes it. A POST sent on a connection the upstream
    # closes at that moment is never resent (RFC 9112 §9.3.1), so this race must stay rare.
    keepalive_expiry_s: float = 4.0


# The wait for the response headers and for each later body chunk. For a streaming
# completion the longest silent gap is usually the first one: queueing in the engine (vLLM
# holds a request in its waiting queue while the batch is full) plus the prefill of the
# whole prompt, which for a 100k-token prompt on a slow or shared GPU is minutes, not
# seconds. 300 s covers that with margin, and a hung upstream holds a client and a pool slot
# for at most that long. A non-streamed completion sends its headers only when generation
# ends: one longer than this needs a larger value.
READ_TIMEOUT_S = 300.0


class Upstream:
    """One upstream base URL (http or https) behind a pool of keep-alive connections.

    >>> upstream = Upstream("http://127.0.0.1:8000/api")
    >>> upstream.target("/v1/models", b"a=1"), upstream.host_header
    ('/api/v1/models?a=1', b'127.0.0.1:8000')
    """

    def __init__(self, base_url: str, limits: UpstreamLimits = UpstreamLimits(), *,
                 clock_ns: Callable[[], int] = time.perf_counter_ns,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the upstream must be an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.limits = limits
        self.clock_ns = clock_ns
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode("latin-1")
        self.path_prefix = parts.path.rstrip("/")
        self.ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self._idle: deque[Http1Connection] = deque()
        self._all: set[Http1Connection] = set()
        self._slot_waiters: deque[asyncio.Future] = deque()
        self._closed = False

    def target(self, path: str, query: bytes = b"") -> str:
        return self.path_prefix + path + (("?" + query.decode("latin-1")) if query else "")

    def exchange(self, method: str, path: str, query: bytes,
                 headers: Iterable[tuple[str, str]], body: bytes) -> UpstreamExchange:
        """One request, not yet sent: `await exchange.send()` or `response_head()` sends it."""
        head = [f"{method} {self.target(path, query)} HTTP/1.1\r\n".encode("latin-1"),
                b"host: ", self.host_header, b"\r\n"]
        for name, value in headers:
            head += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        if body or method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
            head += (b"content-length: %d\r\n" % len(body),)
        head.append(b"\r\n")
        return UpstreamExchange(self, b"".join(head) + body, method == "HEAD")

    # --- the pool -----------------------------------------------------------------------

    async def acquire(self) -> tuple[Http1Connection, bool]:
        """(connection, reused): an idle kept-alive one when there is one, else a new one
        while under `max_connections`, else the first one released within `pool_timeout_s`."""
        deadline_s = None
        while True:
            conn = self._pop_idle()
            if conn is not None:
                return conn, True
            if len(self._all) < self.limits.max_connections:
                return await self._connect(), False
            if deadline_s is None:
                deadline_s = time.monotonic() + self.limits.pool_timeout_s
            await self._wait_for_release(deadline_s)

    def release(self, conn: Http1Connection) -> None:
        """Back to the pool when it can serve another request, else closed; either way a
        request waiting for a connection is woken."""
        if conn.finish() and not self._closed and len(self._idle) < self.limits.max_idle_connections:
            self._idle.append(conn)
            self._wake_one()
        else:
            self._discard(conn)

    def _pop_idle(self) -> Http1Connection | None:
        now_s = time.monotonic()
        while self._idle:
            conn = self._idle.pop()    # the most recently used: the least likely to be stale
            if (not conn.closed and not conn.transport.is_closing()
                    and now_s - conn.idle_since_s < self.limits.keepalive_expiry_s):
                return conn
            self._discard(conn)
        return None

    def _discard(self, conn: Http1Connection) -> None:
        conn.abort()
        self._forget(conn)

    def _forget(self, conn: Http1Connection) -> None:
        """Out of the pool: closed by us or by the upstream (an idle keep-alive timeout)."""
        if conn in self._all:
            self._all.remove(conn)
            if not conn.busy and conn in self._idle:
                self._idle.remove(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _wait_for_release(self, deadline_s: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            async with asyncio.timeout(max(deadline_s - time.monotonic(), 0)):
                await waiter
        except TimeoutError:
            raise UpstreamFailure(504, TIMEOUT, "no upstream connection became free "
                                  f"within {self.limits.pool_timeout_s} s") from None
        finally:
            if not waiter.done():
                waiter.cancel()

    async def _connect(self) -> Http1Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.limits.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Http1Connection(clock_ns=self.clock_ns, on_lost=self._forget),
                    self.host, self.port,
                    ssl=self.ssl, server_hostname=self.host if self.ssl else None)
        except TimeoutError:
            raise UpstreamFailure(504, TIMEOUT, f"connecting to the upstream "
                                  f"{self.base_url} timed out") from None
        except OSError as exc:
            raise UpstreamFailure(502, UPSTREAM_UNAVAILABLE,
                                  f"upstream {self.base_url} unreachable: {exc}") from None
        self._all.add(conn)
        return conn

    def pool_state(self) -> tuple[int, int]:
        """(open connections, connections busy with a request) — for tests and drains."""
        live = [c for c in self._all if not c.closed]
        return len(live), sum(1 for c in live if c.busy)

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._all):
            self._discard(conn)
        self._idle.clear()


class UpstreamExchange:
    """One request/response on a pooled connection; `abort()` at any point lets the
    upstream go (its connection is reset, so it stops generating).

    Inside a coroutine::

        exchange = upstream.exchange("POST", "/v1/chat/completions", b"", headers, body)
        head = await exchange.response_head()
        while chunk := await exchange.read():
            ...
        exchange.close()
    """

    __slots__ = ("upstream", "request", "no_body", "handed_ns", "connect_ns", "conn", "aborted",
                 "failure",
                 "_closed")

    def __init__(self, upstream: Upstream, request: bytes, no_body: bool) -> None:
        self.upstream = upstream
        self.request = request
        self.no_body = no_body
        self.handed_ns: int | None = None    # the request went to a transport (perf_counter_ns)
        self.connect_ns: int | None = None   # a new connection's TCP (+TLS) connect; None: pooled
        self.conn: Http1Connection | None = None
        self.aborted = False
        self.failure: UpstreamFailure | None = None   # why no response head came
        self._closed = False

    async def send(self) -> None:
        """Hand the request to a connection and return without waiting for the answer, so
        the caller's own bookkeeping runs while the upstream works instead of before the
        request leaves; `UpstreamFailure` if it cannot be sent. `response_head` sends it
        itself when this was not called.

        A request is sent on another connection only when its connection was seen closed
        before any byte of it was written: once written, the upstream may have read it and
        acted on it, and RFC 9112 §9.3.1 forbids a proxy to retry a non-idempotent request
        (a completion generated twice). A client gone meanwhile is
        `UpstreamFailure.client_gone()`.
        """
        try:
            await self._send()
        except UpstreamFailure as failure:
            self.failure = failure
            raise

    async def response_head(self) -> ResponseHead:
        """Send the request (unless `send` did) and wait for the response headers;
        `UpstreamFailure` if none. A connection the upstream closes after the write is a
        502, a head not begun within the read timeout a 504.
        """
        try:
            if self.handed_ns is None:
                await self._send()
            return await self._read_head()
        except UpstreamFailure as failure:
            self.failure = failure
            raise

    async def _send(self) -> None:
        for attempt in (0, 1):
            acquire_ns = self.upstream.clock_ns()
            conn, reused = await self.upstream.acquire()
            self.connect_ns = None if reused else self.upstream.clock_ns() - acquire_ns
            self.conn = conn
            if self.aborted:
                raise UpstreamFailure.client_gone()
            # Stamped before the write: the upstream cannot have the request earlier, which the
            # engine join relies on (its window starts here, tracer/engines/placement.py);
            # marked only once the write went through (a retry gets its own stamp).
            handed_ns = self.upstream.clock_ns()
            try:
                conn.start(self.request, no_body=self.no_body)
            except UpstreamClosedBeforeSend as exc:
                self.upstream.release(conn)   # closed, so it leaves the pool
                self.conn = None
                if attempt == 0:
                    continue
                raise UpstreamFailure(502, UPSTREAM, f"no upstream connection ({exc})") from None
            self.handed_ns = handed_ns
            return

    async def _read_head(self) -> ResponseHead:
        timeout_s = self.upstream.limits.read_timeout_s
        try:
            return await self.conn.read_head(timeout_s)
        except UpstreamTimeout:
            self.close()
            raise UpstreamFailure(504, TIMEOUT, "the upstream sent no response headers "
                                  f"within {timeout_s} s") from None
        except UpstreamError as exc:
            self.close()
            if self.aborted:
                raise UpstreamFailure.client_gone() from None
            raise UpstreamFailure(502, UPSTREAM, "the upstream failed before answering "
                                  f"({exc})") from None

    def read(self) -> Awaitable[bytes]:
        """The body bytes received since the last read; b"" at the end. Raises
        `UpstreamTimeout` on a stall and `UpstreamError` when the body breaks off. (The
        connection's own coroutine, awaited by the caller: a relay reads once per event, and
        a coroutine of our own around it was one more frame each time.)"""
        return self.conn.read_body(self.upstream.limits.read_timeout_s)

    def push(self, sink: Callable[[bytes], bool]) -> Awaitable[None]:
        """Hand the body reads to `sink` as they arrive, until `read` has something to say
        (`Http1Connection.push_body`: the last read, an end, an error, or a sink that
        returned False); then read on with `read`."""
        return self.conn.push_body(sink, self.upstream.limits.read_timeout_s)

    @property
    def overran(self) -> bool:
        """Bytes came after the response's declared end (a Content-Length it outran)."""
        return self.conn is not None and self.conn.overran

    @property
    def has_body_bytes(self) -> bool:
        """Body bytes have arrived that `read` has not returned yet."""
        return self.conn is not None and self.conn.has_body_bytes

    @property
    def at_end(self) -> bool:
        """The body arrived whole and `read` returned all of it: the next read is b""."""
        return self.conn is not None and self.conn.at_end

    @property
    def last_data_ns(self) -> int:
        """When the newest upstream bytes arrived (perf_counter_ns)."""
        return self.conn.last_data_ns

    def abort(self) -> None:
        if self._closed:   # the connection may already serve another request
            return
        self.aborted = True
        if self.conn is not None:
            self.conn.abort()

    def close(self) -> None:
        """Return the connection (reused only if the response ended cleanly); idempotent."""
        if self._closed or self.conn is None:
            return
        self._closed = True
        self.upstream.release(self.conn)
