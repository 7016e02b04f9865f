"""An upstream that attacks the proxy: a response head without end, one endless header line,
a body past its declared Content-Length, a stream that would fill memory. Each is bounded,
ends as an upstream error on the trace, and costs no other request anything."""
from __future__ import annotations

import asyncio
import json
import sys
import threading

import httpx
import pytest

from proxy_support import wait_until
from tracer.proxy.http1 import DEFAULT_MAX_HEAD_BYTES, DEFAULT_MAX_HEADERS
from tracer.record.emits import MAX_SEND_TIMES
from tracer.testing.fake_upstream import MODEL, FakeUpstream

STREAM = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
WAIT_S = 20.0


class RawUpstream:
    """A loopback server in its own thread: `scenario(reader, writer)` answers each
    connection with exactly the bytes it writes; `written` counts what it got out before the
    proxy hung up, `closed` is set once it did."""

    def __init__(self, scenario) -> None:
        self.scenario = scenario
        self.written = 0
        self.closed = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RawUpstream:
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(WAIT_S)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._on_connect, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _on_connect(self, reader, writer) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await self.scenario(self, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            writer.close()

    async def write(self, writer, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.written += len(data)


def _post(proxy, body=STREAM) -> httpx.Response:
    return httpx.post(proxy.base_url + "/v1/chat/completions", json=body, timeout=WAIT_S)


def _record(proxy):
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(10)
    return record


async def _many_headers(server, writer) -> None:
    await server.write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
    for i in range(100_000):   # the 1.88 MB head of the report
        await server.write(writer, b"x-h%d: %s\r\n" % (i, b"v" * 8))


async def _endless_head(server, writer) -> None:
    await server.write(writer, b"HTTP/1.1 200 OK\r\n")
    while True:
        await server.write(writer, b"x-a: " + b"a" * 8192 + b"\r\n")


async def _endless_line(server, writer) -> None:
    await server.write(writer, b"HTTP/1.1 200 OK\r\nx-endless: ")
    while True:
        await server.write(writer, b"a" * 8192)


@pytest.mark.parametrize("scenario", [_many_headers, _endless_head, _endless_line])
def test_an_oversized_response_head_is_a_502_and_is_cut_off(proxy_factory, fake_upstream,
                                                            scenario):
    with RawUpstream(scenario) as upstream:
        proxy = proxy_factory(upstream.base_url)
        response = _post(proxy)
        assert response.status_code == 502
        assert "response head exceeds" in response.json()["error"]["message"]
        # The proxy hung up at once (without the bound it reads on until its 300 s read
        # timeout): the upstream got no further than the bound plus the loopback sockets'
        # buffers (a few MB).
        assert upstream.closed.wait(WAIT_S)
        assert upstream.written < 16 << 20
    record = _record(proxy)
    assert (record.finish_reason, record.error_type) == ("error", "upstream")
    assert proxy.parts.upstream.pool_state() == (0, 0)
    # A bystander through the same proxy, to a sane upstream, is untouched.
    other = proxy_factory(fake_upstream.base_url)
    assert _post(other).status_code == 200


def test_the_head_limits_are_bounds_not_guesses():
    # A head at the bound is accepted by construction; the bounds sit far above what the
    # engines send (a few hundred bytes) and below what would hurt (the 1.88 MB head).
    assert 8 << 10 <= DEFAULT_MAX_HEAD_BYTES <= 1 << 20 and 64 <= DEFAULT_MAX_HEADERS <= 1024


def _sse_event(text: str, finish: str | None = None) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text} if text else {},
                          "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _sse_past_its_length(server, writer) -> None:
    first = _sse_event("a")
    await server.write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                       b"content-length: %d\r\n\r\n" % len(first) + first)
    await server.write(writer, _sse_event("b") + _sse_event("", "stop") + b"data: [DONE]\n\n")


async def _json_past_its_length(server, writer) -> None:
    body = json.dumps({"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}]})
    await server.write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                       b"content-length: 20\r\n\r\n" + body.encode())


@pytest.mark.parametrize("scenario", [_sse_past_its_length, _json_past_its_length])
def test_a_body_past_its_declared_length_is_an_upstream_error(proxy_factory, scenario):
    with RawUpstream(scenario) as upstream:
        proxy = proxy_factory(upstream.base_url)
        body = STREAM if scenario is _sse_past_its_length else {**STREAM, "stream": False}
        try:
            response = _post(proxy, body)
            text = response.text
        except httpx.HTTPError:   # the JSON case: the proxy may close the connection
            text = ""
    record = _record(proxy)
    assert (record.finish_reason, record.error_type) == ("error", "upstream")
    if scenario is _sse_past_its_length:
        assert "upstream_stream_cut" in text and "[DONE]" not in text


def test_a_long_stream_keeps_a_bounded_record(proxy_factory):
    num_chunks = 20_000
    upstream = FakeUpstream(chunks=num_chunks, gap_ms=0).start()
    try:
        proxy = proxy_factory(upstream.base_url)
        with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=STREAM,
                          timeout=120) as response:
            relayed = sum(line.startswith("data: {") for line in response.iter_lines())
        assert response.status_code == 200 and relayed >= num_chunks
        record = _record(proxy)
    finally:
        upstream.stop()
    assert record.finish_reason == "stop" and record.itl.count == num_chunks - 1
    assert len(record.itl.first_ns) == MAX_SEND_TIMES - 1
    # What the trace store keeps of this record does not grow with the stream: its gaps,
    # events and stages, with their containers.
    kept = (sys.getsizeof(record.itl.first_ns) + sys.getsizeof(record.itl.bucket_counts)
            + sys.getsizeof(record.events) + sum(sys.getsizeof(e[2]) for e in record.events)
            + sys.getsizeof(record.stages))
    assert kept < 4096, kept
    assert wait_until(lambda: proxy.parts.upstream.pool_state()[1] == 0, WAIT_S)
