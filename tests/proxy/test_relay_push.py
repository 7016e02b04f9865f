"""The relay's direct path: an upstream read handed to the client from the upstream
connection's own callback (`Http1Connection.push_body`) and written to uvicorn's transport
without ASGI `send` (tracer/proxy/client_body.py), with the same bytes, writes, marks and
backpressure as the `send` path, which is kept where `send` is not uvicorn's own."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from tracer.proxy import stream
from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.proxy.client_body import ClientBody
from tracer.proxy.http1 import Http1Connection
from tracer.proxy.upstream_errors import UpstreamTimeout
from tracer.testing.fake_upstream import MODEL, FakeUpstream
from tracer.testing.transport import RecordingTransport, serve_request
from tracer.web.observability import ObservabilitySettings

CHAT = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
WAIT_S = 5.0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


@pytest.fixture
def pushed(monkeypatch) -> list[bytes]:
    """Every read the relay took from the connection's hand (the direct path)."""
    reads: list[bytes] = []
    original = stream.Relay._pushed

    def spy(self, chunk: bytes) -> bool:
        taken = original(self, chunk)
        if taken:
            reads.append(chunk)
        return taken
    monkeypatch.setattr(stream.Relay, "_pushed", spy)
    return reads


@pytest.fixture
def spaced_upstream():
    upstream = FakeUpstream(chunks=8, gap_ms=15).start()
    yield upstream
    upstream.stop()


def _raw(url: str, headers: dict | None = None) -> bytes:
    with httpx.stream("POST", url, json=CHAT, headers=headers or {}, timeout=10) as response:
        assert response.status_code == 200
        return b"".join(response.iter_raw())


def test_the_middle_reads_take_the_direct_path_and_change_nothing(proxy_factory, spaced_upstream,
                                                                   pushed):
    proxy = proxy_factory(spaced_upstream.base_url)
    direct = _raw(spaced_upstream.base_url + "/v1/chat/completions")
    relayed = _raw(proxy.base_url + "/v1/chat/completions")
    assert relayed == direct
    # The first read and the last ([DONE] and the end) go through `read`; the reads between
    # are whole events, the content tokens among them. On a loaded machine the finish event
    # may come in a read of its own before [DONE], and the head in a read of its own before
    # the role-only event (`push_body` then takes the role event too): each is then a middle
    # read, up to every event but [DONE] (seen in CI: 10 pushed reads of 8 content events).
    assert 1 <= len(pushed) <= spaced_upstream.chunks + 2
    assert all(read.startswith(b"data: ") and read.endswith(b"\n\n") for read in pushed)
    assert any(b'"content":"tok' in read for read in pushed)
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(1)
    assert record.num_output_tokens == spaced_upstream.chunks
    assert record.itl.count == spaced_upstream.chunks - 1
    assert record.finish_reason == "stop" and record.error_type is None


def test_a_wrapped_send_keeps_the_send_path(proxy_factory, spaced_upstream, pushed):
    """CORS for an allowed origin wraps `send`: no direct writes, the same bytes."""
    origin = "https://chat.example"
    proxy = proxy_factory(spaced_upstream.base_url,
                          observability=ObservabilitySettings(cors_origins=(origin,)))
    direct = _raw(spaced_upstream.base_url + "/v1/chat/completions")
    assert _raw(proxy.base_url + "/v1/chat/completions", {"origin": origin}) == direct
    assert pushed == []
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(1)
    assert record.num_output_tokens == spaced_upstream.chunks


def test_client_body_is_only_uvicorns_started_chunked_cycle():
    async def send(message):
        pass
    assert ClientBody.of(send) is None
    assert ClientBody.of(None) is None


def test_a_full_client_transport_holds_the_next_read_until_it_drains(monkeypatch, pushed):
    """uvicorn's flow control, as through `send`: while the client's transport asks to pause
    writing, an upstream read is not written (nor pushed); it leaves once it drains."""
    import tracer.testing.transport as transport_module
    events = [_event(f"t{i}") for i in range(4)]
    client = RecordingTransport()
    box: dict = {}
    make = transport_module.guarded_protocol_class

    def capture(limits):
        class Captured(make(limits)):
            def connection_made(self, transport):
                box["protocol"] = self
                super().connection_made(transport)
        return Captured
    monkeypatch.setattr(transport_module, "guarded_protocol_class", capture)

    async def upstream(reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)

        async def written(part: bytes) -> None:
            client.wrote.clear()
            writer.write(part)
            await asyncio.wait_for(client.wrote.wait(), WAIT_S)
        await written(HEAD + _chunk(events[0]))
        await written(_chunk(events[1]))             # pushed
        box["protocol"].pause_writing()
        before = len(client.calls)
        writer.write(_chunk(events[2]))              # arrives while the client is full
        for _ in range(20):
            await asyncio.sleep(0.005)
        box["while_paused"] = len(client.calls) - before
        client.wrote.clear()
        box["protocol"].resume_writing()
        await asyncio.wait_for(client.wrote.wait(), WAIT_S)
        await written(_chunk(events[3]))
        await written(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        writer.close()

    async def main():
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        parts = create_proxy_app(ProxySettings(f"http://127.0.0.1:{port}"),
                                 model_names=(MODEL,), registry=CollectorRegistry(),
                                 tracer_provider=TracerProvider())
        body = json.dumps(CHAT).encode()
        request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: "
                   b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        try:
            return await asyncio.wait_for(serve_request(parts.app, request, client), 20)
        finally:
            await parts.upstream.aclose()
            parts.obs.close()
            server.close()

    calls = asyncio.run(main())
    assert box["while_paused"] == 0
    body = b"".join(calls).partition(b"\r\n\r\n")[2]
    assert body == b"".join(_chunk(e) for e in events) + _chunk(b"data: [DONE]\n\n") + \
        b"0\r\n\r\n"
    assert events[1] in pushed and events[2] not in pushed   # declined while full, then sent


async def _connection_to(parts_to_send, gaps_s=()):
    """A connection to a raw server writing `parts_to_send` (after the request), each after
    its gap, and the request started on it."""
    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        for i, part in enumerate(parts_to_send):
            if i < len(gaps_s) and gaps_s[i]:
                await asyncio.sleep(gaps_s[i])
            writer.write(part)
            await writer.drain()
        await reader.read()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, conn = await asyncio.get_running_loop().create_connection(Http1Connection, "127.0.0.1",
                                                                 port)
    conn.start(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    return server, conn


def test_push_body_hands_over_the_middle_reads_and_leaves_the_last_to_read_body():
    async def main():
        parts = [HEAD + _chunk(b"a"), _chunk(b"b"), _chunk(b"c"), _chunk(b"d") + b"0\r\n\r\n"]
        server, conn = await _connection_to(parts, gaps_s=(0, 0.02, 0.02, 0.02))
        got = []
        await conn.read_head(WAIT_S)
        assert await conn.read_body(WAIT_S) == b"a"
        await asyncio.wait_for(conn.push_body(lambda b: got.append(b) or True, WAIT_S), WAIT_S)
        assert got == [b"b", b"c"]
        assert await conn.read_body(WAIT_S) == b"d"      # the last read: never pushed
        assert await conn.read_body(WAIT_S) == b"" and conn.complete
        conn.abort()
        server.close()
    asyncio.run(main())


def test_push_body_stops_when_the_sink_says_so_and_raises_what_it_raises():
    async def main():
        parts = [HEAD, _chunk(b"a"), _chunk(b"b"), _chunk(b"c") + b"0\r\n\r\n"]
        server, conn = await _connection_to(parts, gaps_s=(0, 0.02, 0.02, 0.02))
        await conn.read_head(WAIT_S)
        got = []
        await asyncio.wait_for(conn.push_body(lambda b: got.append(b) and False, WAIT_S), WAIT_S)
        assert got == [b"a"]
        assert await conn.read_body(WAIT_S) == b"a"      # not taken: left to the reader

        def broken(body):
            raise ValueError(body)
        with pytest.raises(ValueError):
            await asyncio.wait_for(conn.push_body(broken, WAIT_S), WAIT_S)
        conn.abort()
        server.close()
    asyncio.run(main())


def test_push_body_bounds_each_gap_by_the_read_timeout():
    async def main():
        parts = [HEAD, _chunk(b"a"), _chunk(b"b"), _chunk(b"late")]
        server, conn = await _connection_to(parts, gaps_s=(0, 0.05, 0.05, 2.0))
        await conn.read_head(0.08)   # the timeout is the connection's, as in the relay
        got = []
        # Each gap (50 ms) is under the timeout, their sum is not: only the 2 s gap trips it.
        await asyncio.wait_for(conn.push_body(lambda b: got.append(b) or True, 0.08), WAIT_S)
        assert got == [b"a", b"b"]
        with pytest.raises(UpstreamTimeout):
            await conn.read_body(0.08)
        conn.abort()
        server.close()
    asyncio.run(main())
