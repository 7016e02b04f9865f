"""The proxy's upstream HTTP/1.1 client against real loopback servers.

Covers `tracer.proxy.http1.Http1Connection` (response framing: content-length, chunked in
arbitrary TCP pieces, close-delimited, HEAD; errors: a close mid-body, a malformed response,
read timeouts; backpressure via `pause_reading`) and `tracer.proxy.upstream.Upstream` (the
keep-alive pool: reuse, a stale idle connection retried once, max_connections and the pool
timeout, abort, the failure statuses 502/504/499, the request bytes on the wire, the times the
exchange reports), plus the pure header filters `forward_headers` / `response_headers`.

Every server is a small raw `asyncio.start_server` on 127.0.0.1 that writes exactly the bytes
a scenario needs. Synchronisation is by events and futures, each bounded by a timeout.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

import pytest

from tracer.proxy.headers import forward_headers, response_headers
from tracer.proxy.upstream import Upstream, UpstreamLimits
from tracer.proxy.http1 import Http1Connection
from tracer.proxy.upstream_errors import UpstreamClosed, UpstreamFailure, UpstreamTimeout

WAIT_S = 5.0          # the bound on every wait for an event in these tests

OK_HEAD = b"HTTP/1.1 200 OK\r\n"


def run(coro):
    """Run one test body on a fresh loop, bounded as a whole."""
    return asyncio.run(asyncio.wait_for(coro, 15))


async def wait(awaitable):
    return await asyncio.wait_for(awaitable, WAIT_S)


async def poll_until(predicate, what: str) -> None:
    """A bounded poll of loop-visible state (never a sleep used as synchronisation)."""
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def response(body: bytes, *headers: bytes) -> bytes:
    """A content-length framed 200 response."""
    extra = b"".join(h + b"\r\n" for h in headers)
    return OK_HEAD + b"content-length: %d\r\n" % len(body) + extra + b"\r\n" + body


def chunked(*chunks: bytes) -> bytes:
    """A chunked 200 response with these chunks."""
    out = [OK_HEAD, b"transfer-encoding: chunked\r\n\r\n"]
    for chunk in chunks:
        out.append(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


class Server:
    """A raw loopback server: `handler(server, reader, writer, index)` per connection
    (index counts from 1); it records connections and the requests read with
    `read_request`."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.port = 0
        self.connections = 0
        self.requests: list[bytes] = []
        self.tasks: set[asyncio.Task] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.tasks.add(asyncio.current_task())
        self.writers.append(writer)
        try:
            await self.handler(self, reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:   # the teardown of `serve`: end quietly
            pass
        finally:
            writer.transport.abort()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request (head and content-length body), or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


async def until_disconnected(reader: asyncio.StreamReader) -> None:
    """Return when the peer closed or reset the connection."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass


@contextlib.asynccontextmanager
async def serve(handler):
    srv = Server(handler)
    server = await asyncio.start_server(srv._on_connect, "127.0.0.1", 0)
    srv.port = server.sockets[0].getsockname()[1]
    try:
        yield srv
    finally:
        server.close()
        for writer in srv.writers:
            writer.transport.abort()
        for task in srv.tasks:
            task.cancel()
        await asyncio.gather(*srv.tasks, return_exceptions=True)
        await server.wait_closed()


def upstream_for(srv: Server, path: str = "", **limits) -> Upstream:
    return Upstream(f"http://127.0.0.1:{srv.port}{path}", UpstreamLimits(**limits))


async def read_all(exchange) -> list[bytes]:
    """Every read() result up to (not including) the final b""."""
    chunks = []
    while chunk := await wait(exchange.read()):
        chunks.append(chunk)
    return chunks


async def get(upstream: Upstream, path: str = "/x"):
    """GET path; (exchange, head, body) with the exchange not yet closed."""
    exchange = upstream.exchange("GET", path, b"", [], b"")
    head = await wait(exchange.response_head())
    body = b"".join(await read_all(exchange))
    return exchange, head, body


async def failure_of(exchange) -> UpstreamFailure:
    with pytest.raises(UpstreamFailure) as info:
        await wait(exchange.response_head())
    return info.value


# --- framing and keep-alive reuse -----------------------------------------------------------

def test_content_length_then_chunked_on_one_kept_alive_connection():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(response(b"hello", b"Content-Type: text/plain"))
        await srv.read_request(reader)
        writer.write(chunked(b"wor", b"ld!"))
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            ex1, head1, body1 = await get(upstream, "/one")
            assert head1.status == 200 and head1.header(b"content-type") == b"text/plain"
            assert body1 == b"hello" and ex1.conn.complete
            ex1.close()
            assert upstream.pool_state() == (1, 0)
            ex2, head2, body2 = await get(upstream, "/two")
            assert head2.header(b"transfer-encoding") == b"chunked"
            assert body2 == b"world!" and ex2.conn.complete
            assert ex2.conn is ex1.conn and ex2.conn.num_requests == 2
            ex2.close()
            assert upstream.pool_state() == (1, 0)
            assert srv.connections == 1
            assert [r.split(b" ")[1] for r in srv.requests] == [b"/one", b"/two"]
            await upstream.aclose()
            assert upstream.pool_state() == (0, 0)

    run(body())


def test_chunked_body_split_across_many_tcp_writes():
    wire = [OK_HEAD + b"transfer-encoding: chunked\r\n\r\n5\r\nhel",   # body: "hel"
            b"lo\r\n1",                                                # "lo", size line cut
            b"0\r\n0123456",                                           # 0x10-byte chunk
            b"789abcdef\r\n3\r\nx",
            b"yz\r\n0\r\n",
            b"\r\n"]                                                    # completes
    expected = b"hello0123456789abcdefxyz"
    pieces: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        while True:
            writer.write(await pieces.get())
            await writer.drain()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("GET", "/stream", b"", [], b"")
            pieces.put_nowait(wire[0])
            head = await wait(exchange.response_head())
            assert head.status == 200
            reads = []
            for piece in wire[1:]:
                # every piece but the last carries body bytes: one read per piece
                reads.append(await wait(exchange.read()))
                pieces.put_nowait(piece)
            reads += await read_all(exchange)
            assert b"".join(reads) == expected
            assert len(reads) >= len(wire) - 1 and all(reads)
            assert await wait(exchange.read()) == b""          # and stays b"" at the end
            assert exchange.conn.complete
            exchange.close()
            assert upstream.pool_state() == (1, 0)
            await upstream.aclose()

    run(body())


def test_close_delimited_body_completes_at_eof_and_is_not_reused():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(OK_HEAD + b"content-type: text/plain\r\n\r\nfirst part, ")
        await writer.drain()
        writer.write(b"second part")
        await writer.drain()
        writer.close()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange, head, data = await get(upstream)
            assert head.status == 200
            assert data == b"first part, second part"
            assert exchange.conn.complete
            exchange.close()
            assert upstream.pool_state()[0] == 0
            await upstream.aclose()

    run(body())


def test_close_delimited_body_cut_by_a_reset_is_an_error_not_a_complete_body():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(OK_HEAD + b"content-type: text/plain\r\n\r\nfirst part, ")
        await writer.drain()
        # SO_LINGER 0: close() sends RST, not FIN (a crashed upstream, a dropped link).
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                   struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("GET", "/x", b"", [], b"")
            await wait(exchange.response_head())
            received = b""
            with pytest.raises(UpstreamClosed):
                while chunk := await wait(exchange.read()):
                    received += chunk
            assert received in (b"", b"first part, ") and not exchange.conn.complete
            exchange.close()
            await upstream.aclose()

    run(body())


def test_stale_idle_connection_closed_by_server_is_replaced():
    pooled = asyncio.Event()
    server_closed_idle = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(response(b"r%d" % index))
        await writer.drain()
        if index == 1:                       # close the now idle kept-alive connection
            await pooled.wait()
            writer.close()
            await writer.wait_closed()
            server_closed_idle.set()
        else:
            await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            ex1, _, body1 = await get(upstream)
            ex1.close()
            assert body1 == b"r1" and upstream.pool_state() == (1, 0)
            pooled.set()
            await wait(server_closed_idle.wait())
            await poll_until(lambda: upstream.pool_state()[0] == 0, "the idle close to be seen")
            # The dead connection left the pool when it closed, not at the next request.
            assert not upstream._idle and not upstream._all
            ex2, head2, body2 = await get(upstream)
            assert head2.status == 200 and body2 == b"r2"
            assert srv.connections == 2 and ex2.conn is not ex1.conn
            ex2.close()
            assert upstream.pool_state() == (1, 0)
            await upstream.aclose()

    run(body())


def test_a_post_the_upstream_read_is_never_resent_when_it_closes_without_answering():
    """RFC 9112 §9.3.1: a proxy must not retry a non-idempotent request. The close is not
    yet seen when request 2 is written: the server reads it on the kept-alive connection and
    closes without a byte. Resending it could generate the completion twice (before: the
    pool resent it once on a new connection)."""
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        if index == 1:
            writer.write(response(b"first"))
            await srv.read_request(reader)    # request 2 on the same connection: no answer
            return                             # (the connection is closed)
        writer.write(response(b"second"))
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            ex1, _, body1 = await get(upstream)
            ex1.close()
            assert body1 == b"first"
            exchange = upstream.exchange("POST", "/again", b"", [], b"payload")
            failure = await failure_of(exchange)
            assert (failure.status, failure.error_type) == (502, "upstream")
            assert srv.connections == 1
            assert len(srv.requests) == 2 and srv.requests[1].endswith(b"\r\n\r\npayload")
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


def test_a_connection_seen_closed_before_the_write_gets_nothing_and_another_is_used():
    """The only resend allowed: nothing of the request reached the upstream. The upstream's
    close is processed (transport closing) after the pool handed the connection out but
    before the write."""
    async def body():
        async with serve(_answer_each_request()) as srv:
            upstream = upstream_for(srv)
            ex1, _, body1 = await get(upstream)
            ex1.close()
            pop_idle = upstream._pop_idle

            def pop_then_close():
                conn = pop_idle()
                if conn is not None:
                    conn.transport.close()   # as the upstream's FIN would, before the write
                return conn
            upstream._pop_idle = pop_then_close
            exchange = upstream.exchange("POST", "/y", b"", [], b"payload")
            head = await wait(exchange.response_head())
            assert head.status == 200 and b"".join(await read_all(exchange)) == b"c2r1"
            assert srv.connections == 2
            assert [r.split(b" ")[1] for r in srv.requests] == [b"/x", b"/y"]   # /y once
            exchange.close()
            await upstream.aclose()

    run(body())


def test_start_on_a_closing_connection_writes_nothing():
    from tracer.proxy.upstream_errors import UpstreamClosedBeforeSend

    async def body():
        async with serve(_answer_each_request()) as srv:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(Http1Connection, "127.0.0.1", srv.port)
            conn.transport.close()
            with pytest.raises(UpstreamClosedBeforeSend):
                conn.start(b"POST / HTTP/1.1\r\ncontent-length: 1\r\n\r\nx")
            assert conn.num_requests == 0 and not conn.busy
            await poll_until(lambda: srv.connections == 1 and conn.closed, "the close")
            assert srv.requests == []

    run(body())


def test_idle_connections_are_kept_for_less_than_uvicorns_keep_alive():
    assert UpstreamLimits().keepalive_expiry_s < 5.0   # uvicorn's --timeout-keep-alive


def test_http_1_0_upstream_close_delimited_body_and_no_keep_alive():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        for i in range(3):
            writer.write(b"data: %d\n\n" % i)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            for n in (1, 2):
                exchange = upstream.exchange("POST", "/v1/chat/completions", b"", [], b"{}")
                head = await wait(exchange.response_head())
                assert head.status == 200
                assert b"".join(await read_all(exchange)) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
                assert exchange.conn.complete
                exchange.close()
                assert upstream.pool_state() == (0, 0)   # HTTP/1.0: never reused
                assert srv.connections == n
            await upstream.aclose()

    run(body())


def test_new_connection_closed_before_answering_is_not_retried():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)      # then closed without a byte

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("GET", "/x", b"", [], b"")
            failure = await failure_of(exchange)
            assert (failure.status, failure.error_type) == (502, "upstream")
            assert exchange.failure is failure
            assert srv.connections == 1
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


def test_close_mid_chunked_body_raises_after_the_first_bytes():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(OK_HEAD + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        writer.close()                      # before the terminating chunk

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("GET", "/x", b"", [], b"")
            assert (await wait(exchange.response_head())).status == 200
            assert await wait(exchange.read()) == b"hello"
            with pytest.raises(UpstreamClosed) as info:
                await wait(exchange.read())
            assert info.value.received_any
            assert not exchange.conn.complete
            exchange.close()
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


def test_close_mid_content_length_body_raises():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(OK_HEAD + b"content-length: 10\r\n\r\nabc")
        await writer.drain()
        writer.close()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("GET", "/x", b"", [], b"")
            await wait(exchange.response_head())
            assert await wait(exchange.read()) == b"abc"
            with pytest.raises(UpstreamClosed):
                await wait(exchange.read())
            exchange.close()
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


# --- failures before a response -------------------------------------------------------------

def test_read_timeout_on_headers_is_504_and_drops_the_connection():
    disconnected = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        await until_disconnected(reader)     # never answers
        disconnected.set()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv, read_timeout_s=0.2)
            exchange = upstream.exchange("GET", "/x", b"", [], b"")
            failure = await failure_of(exchange)
            assert (failure.status, failure.error_type) == (504, "timeout")
            await wait(disconnected.wait())
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


def test_read_timeout_between_body_chunks():
    disconnected = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(OK_HEAD + b"transfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await until_disconnected(reader)     # then stalls
        disconnected.set()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv, read_timeout_s=0.2)
            exchange = upstream.exchange("GET", "/x", b"", [], b"")
            await wait(exchange.response_head())
            assert await wait(exchange.read()) == b"hi"
            with pytest.raises(UpstreamTimeout) as info:
                await wait(exchange.read())
            assert info.value.received_any
            exchange.close()
            await wait(disconnected.wait())
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


def test_connection_refused_is_502_upstream_unavailable():
    with socket.socket() as sock:          # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def body():
        upstream = Upstream(f"http://127.0.0.1:{port}", UpstreamLimits(connect_timeout_s=2))
        failure = await failure_of(upstream.exchange("GET", "/x", b"", [], b""))
        assert (failure.status, failure.error_type) == (502, "upstream_unavailable")
        assert upstream.pool_state() == (0, 0)
        await upstream.aclose()

    run(body())


def test_malformed_response_is_502_upstream():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(b"NOT HTTP\r\n\r\n")
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            failure = await failure_of(upstream.exchange("GET", "/x", b"", [], b""))
            assert (failure.status, failure.error_type) == (502, "upstream")
            assert upstream.pool_state() == (0, 0)
            await upstream.aclose()

    run(body())


def test_abort_while_waiting_for_headers_is_499_and_resets_the_upstream():
    got_request = asyncio.Event()
    disconnected = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        got_request.set()
        await until_disconnected(reader)     # holds the request
        disconnected.set()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("POST", "/slow", b"", [], b"{}")
            task = asyncio.create_task(exchange.response_head())
            await wait(got_request.wait())
            assert not task.done()
            exchange.abort()
            with pytest.raises(UpstreamFailure) as info:
                await wait(task)
            assert (info.value.status, info.value.error_type) == (499, "abort")
            await wait(disconnected.wait())
            exchange.close()
            assert upstream.pool_state() == (0, 0)
            assert srv.connections == 1                    # not retried
            await upstream.aclose()

    run(body())


# --- HEAD, backpressure ---------------------------------------------------------------------

def test_head_completes_at_the_headers_and_is_not_reused():
    disconnected = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(OK_HEAD + b"content-length: 100\r\n\r\n")
        await until_disconnected(reader)
        disconnected.set()

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange = upstream.exchange("HEAD", "/x", b"", [], b"")
            head = await wait(exchange.response_head())
            assert head.status == 200 and head.header(b"content-length") == b"100"
            assert await wait(exchange.read()) == b""
            assert exchange.conn.complete
            exchange.close()
            assert upstream.pool_state() == (0, 0)
            await wait(disconnected.wait())
            request = srv.requests[0]
            assert request.startswith(b"HEAD /x HTTP/1.1\r\n")
            assert b"content-length" not in request.lower()
            await upstream.aclose()

    run(body())


def test_backpressure_bounds_the_buffer_and_loses_nothing():
    total = 8 << 20
    limit = 64 * 1024
    payload = bytes(range(256)) * (total // 256)
    server_drained = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(response(payload))
        await writer.drain()                 # blocks while the client is not reading
        server_drained.set()
        await until_disconnected(reader)

    async def body():
        loop = asyncio.get_running_loop()
        async with serve(handler) as srv:
            _, conn = await wait(loop.create_connection(
                lambda: Http1Connection(max_buffer_bytes=limit), "127.0.0.1", srv.port))
            conn.start(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await wait(conn.read_head(WAIT_S))
            assert head.header(b"content-length") == str(total).encode()
            await poll_until(lambda: conn._paused, "reading to be paused")
            assert not conn.transport.is_reading()
            # The server stays blocked: nothing is read while the client does not read.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(server_drained.wait(), 0.2)
            assert limit < conn._num_body_bytes <= limit + 256 * 1024
            received = bytearray()
            largest = 0
            while chunk := await wait(conn.read_body(WAIT_S)):
                largest = max(largest, len(chunk))
                received += chunk
            assert len(received) == total and received == payload
            assert largest <= limit + 256 * 1024
            assert conn.transport.is_reading()
            await wait(server_drained.wait())
            assert conn.finish() is True
            conn.abort()

    run(body())


# --- the pool: limits -------------------------------------------------------------------------

def _answer_each_request():
    """A keep-alive server: the body of answer n on connection c is b"c<c>r<n>"."""
    async def handler(srv, reader, writer, index):
        n = 0
        while await srv.read_request(reader) is not None:
            n += 1
            writer.write(response(b"c%dr%d" % (index, n)))
    return handler


def test_max_connections_waiter_reuses_the_released_connection():
    """max_connections=1: the second exchange waits for the first, then reuses its
    (kept-alive) connection — one upstream connection for both."""
    async def body():
        async with serve(_answer_each_request()) as srv:
            upstream = upstream_for(srv, max_connections=1, pool_timeout_s=0.5)
            ex1 = upstream.exchange("GET", "/1", b"", [], b"")
            await wait(ex1.response_head())
            ex2 = upstream.exchange("GET", "/2", b"", [], b"")
            second = asyncio.create_task(ex2.response_head())
            await poll_until(lambda: upstream._slot_waiters, "the second to wait for a slot")
            assert not second.done()
            assert b"".join(await read_all(ex1)) == b"c1r1"
            ex1.close()                                    # the connection goes back, kept alive
            try:
                head2 = await wait(second)
            except UpstreamFailure as failure:
                raise AssertionError(
                    "the waiting exchange was not woken when the only connection went "
                    f"back to the pool idle; it failed with {failure.status} "
                    f"{failure.error_type}: {failure.message}") from None
            assert head2.status == 200
            body2 = b"".join(await read_all(ex2))
            assert (body2, srv.connections) == (b"c1r2", 1), (
                "the woken exchange discarded the idle connection and opened a new one "
                f"(body {body2!r}, {srv.connections} upstream connections)")
            ex2.close()
            assert upstream.pool_state() == (1, 0)
            await upstream.aclose()

    run(body())


def test_max_connections_waiter_gets_a_new_connection_after_a_discarded_one():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(response(b"c%d" % index, b"connection: close"))
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv, max_connections=1, pool_timeout_s=2.0)
            ex1 = upstream.exchange("GET", "/1", b"", [], b"")
            await wait(ex1.response_head())
            ex2 = upstream.exchange("GET", "/2", b"", [], b"")
            second = asyncio.create_task(ex2.response_head())
            await poll_until(lambda: upstream._slot_waiters, "the second to wait for a slot")
            assert b"".join(await read_all(ex1)) == b"c1"
            ex1.close()                                   # not reusable: discarded, slot freed
            assert (await wait(second)).status == 200
            assert b"".join(await read_all(ex2)) == b"c2"
            assert srv.connections == 2
            ex2.close()
            await upstream.aclose()

    run(body())


def test_pool_timeout_when_no_connection_frees_up():
    async def body():
        async with serve(_answer_each_request()) as srv:
            upstream = upstream_for(srv, max_connections=1, pool_timeout_s=0.2)
            ex1 = upstream.exchange("GET", "/1", b"", [], b"")
            await wait(ex1.response_head())               # and never closed
            failure = await failure_of(upstream.exchange("GET", "/2", b"", [], b""))
            assert (failure.status, failure.error_type) == (504, "timeout")
            assert srv.connections == 1
            assert upstream.pool_state() == (1, 1)
            ex1.abort()
            ex1.close()
            await upstream.aclose()

    run(body())


def test_expired_idle_connection_is_not_reused():
    async def body():
        async with serve(_answer_each_request()) as srv:
            upstream = upstream_for(srv, keepalive_expiry_s=0.0)
            ex1, _, body1 = await get(upstream)
            ex1.close()
            ex2, _, body2 = await get(upstream)
            ex2.close()
            assert (body1, body2) == (b"c1r1", b"c2r1")
            assert srv.connections == 2
            assert upstream.pool_state() == (1, 0)
            await upstream.aclose()

    run(body())


def test_unsolicited_bytes_on_an_idle_connection_make_it_unusable():
    pooled = asyncio.Event()
    sent_late = asyncio.Event()

    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(response(b"ok%d" % index))
        if index == 1:                       # e.g. an idle-timeout 408 on a kept-alive conn
            await pooled.wait()
            writer.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            sent_late.set()
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange, _, body1 = await get(upstream)
            exchange.close()
            assert body1 == b"ok1" and upstream.pool_state() == (1, 0)
            pooled.set()
            await wait(sent_late.wait())
            await poll_until(lambda: upstream.pool_state()[0] == 0, "the late bytes to be seen")
            ex2, _, body2 = await get(upstream)
            assert body2 == b"ok2" and srv.connections == 2
            ex2.close()
            await upstream.aclose()

    run(body())


def test_bytes_after_the_response_in_the_same_read_are_not_taken_as_its_own():
    """The upstream sends more than the response it was asked for, in the same TCP segment
    as the response's end (a framing bug upstream, or a desync). The extra bytes must not
    become part of the response (status, headers, body), and the connection, whose framing
    can no longer be trusted, must not be reused — as `data_received` already does when
    such bytes arrive in a later read."""
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(response(b"ok", b"x-first: 1")         # one write, one segment
                     + b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 4\r\n"
                       b"x-extra: 1\r\n\r\nEVIL")
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange, head, data = await get(upstream)
            exchange.close()
            reused = upstream.pool_state() == (1, 0)       # kept as an idle connection
            assert (head.status, data, head.header(b"x-extra"), reused) == \
                (200, b"ok", None, False), (
                "a second response in the same read as the end of the first was parsed "
                f"into it: status {head.status}, body {data!r}, headers {head.headers}, "
                f"connection reusable: {reused}")
            await upstream.aclose()

    run(body())


def test_interim_100_continue_is_skipped():
    async def handler(srv, reader, writer, index):
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + response(b"done", b"x-final: 1"))
        await until_disconnected(reader)

    async def body():
        async with serve(handler) as srv:
            upstream = upstream_for(srv)
            exchange, head, data = await get(upstream)
            assert head.status == 200 and head.header(b"x-final") == b"1"
            assert data == b"done"
            exchange.close()
            assert upstream.pool_state() == (1, 0)
            await upstream.aclose()

    run(body())


# --- what goes on the wire, and the timeline --------------------------------------------------

def test_request_bytes_on_the_wire():
    async def body():
        async with serve(_answer_each_request()) as srv:
            upstream = upstream_for(srv, "/prefix/")
            payload = b'{"model": "m"}'
            exchange = upstream.exchange(
                "POST", "/v1/x", b"a=1",
                [("content-type", "application/json"), ("X-Trace", "abc")], payload)
            await wait(exchange.response_head())
            await read_all(exchange)
            exchange.close()
            (request,) = srv.requests
            head, _, sent_body = request.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            assert lines[0] == b"POST /prefix/v1/x?a=1 HTTP/1.1"
            fields = [tuple(part.strip() for part in line.split(b":", 1)) for line in lines[1:]]
            assert (b"host", b"127.0.0.1:%d" % srv.port) in fields
            assert (b"content-type", b"application/json") in fields
            assert (b"X-Trace", b"abc") in fields
            assert (b"content-length", str(len(payload)).encode()) in fields
            assert sum(1 for name, _ in fields if name.lower() == b"content-length") == 1
            assert sent_body == payload
            # a body-less POST still declares its (zero) length; a GET does not
            ex2 = upstream.exchange("POST", "/e", b"", [], b"")
            ex3 = upstream.exchange("GET", "/g", b"", [], b"")
            assert b"content-length: 0\r\n" in ex2.request
            assert b"content-length" not in ex3.request
            await upstream.aclose()

    run(body())


def test_the_exchange_reports_its_times_and_new_connections():
    async def body():
        async with serve(_answer_each_request()) as srv:
            upstream = upstream_for(srv)
            exchanges = []
            for _ in range(2):
                exchange, head, _ = await get(upstream)
                exchanges.append((exchange, head))
                exchange.close()
            for exchange, head in exchanges:
                assert 0 < exchange.handed_ns <= head.received_ns
            (first, first_head), (second, _) = exchanges
            assert second.handed_ns >= first_head.received_ns
            assert 0 <= first.connect_ns < WAIT_S * 1e9   # a new connection: its connect
            assert second.connect_ns is None               # the second reused it
            assert srv.connections == 1
            await upstream.aclose()

    run(body())


# --- header hygiene (pure) --------------------------------------------------------------------

def test_forward_headers_drops_hop_by_hop_and_connection_named_fields():
    raw = [(b"Host", b"client"), (b"Connection", b"keep-alive, X-Secret"),
           (b"X-Secret", b"s"), (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3"),
           (b"TE", b"trailers"), (b"Accept", b"*/*"), (b"Authorization", b"Bearer t"),
           (b"X-Drop-Me", b"1")]
    assert forward_headers(raw, drop=frozenset({"x-drop-me"})) == [
        ("accept", "*/*"), ("authorization", "Bearer t")]


def test_response_headers_keeps_content_length_and_lowercases():
    raw = [(b"Content-Type", b"text/plain"), (b"Content-Length", b"5"),
           (b"Connection", b"close, X-Hop"), (b"X-Hop", b"1"), (b"Keep-Alive", b"timeout=5"),
           (b"Transfer-Encoding", b"chunked"), (b"X-Request-Id", b"r")]
    assert response_headers(raw) == [(b"content-type", b"text/plain"),
                                      (b"content-length", b"5"), (b"x-request-id", b"r")]
    assert response_headers(raw, drop=frozenset({"content-length"})) == [
        (b"content-type", b"text/plain"), (b"x-request-id", b"r")]


def test_send_hands_the_request_over_before_the_head_is_awaited(fake_upstream):
    """`send` returns once the request is written: the caller works while the upstream does,
    and `response_head` then only waits (it sends nothing twice)."""
    async def main():
        upstream = Upstream(fake_upstream.base_url)
        try:
            exchange = upstream.exchange("GET", "/v1/models", b"", [], b"")
            assert exchange.handed_ns is None
            await exchange.send()
            assert exchange.handed_ns is not None and exchange.conn.num_requests == 1
            head = await exchange.response_head()
            assert head.status == 200 and exchange.conn.num_requests == 1
            while await exchange.read():
                pass
            exchange.close()
        finally:
            await upstream.aclose()
    asyncio.run(main())
