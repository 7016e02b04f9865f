"""Issue 39, break 5: a body trickled one byte at a time, against the real fronts on loopback.

Before, the body timeout was a gap between reads only (nginx's `client_body_timeout`), so a
byte every second held a connection forever, forty of them filled the connection cap and
every real client got 503, and a 401 kept reading the body it refused. Now a whole body
has a deadline (docs/reference.md, "Access, beacon tokens and connection limits"), an
answer given before the body ends closes the connection, and a connection arriving at the
cap reclaims the slowest one that is stalled on its client.

The proxy (every route that reads a body: the four completion formats, `/v1/probe`,
`/v1/traces`, the passthrough), the engine and the collector, each under uvicorn with the
guarded protocol as its CLI runs it (`uvicorn_limit_options`), small limits for short tests.
Every wait is on the socket (the server's answer or its close) with a bounded timeout.
"""
from __future__ import annotations

import dataclasses
import json
import socket
import time

import httpx
import pytest
from google.rpc.status_pb2 import Status
from prometheus_client import CollectorRegistry

from reliability_support import Served, read_response, serve, status_of, wait_until
from tracer.collect.app import CollectorSettings, create_collector_app
from tracer.proxy.app import ProxySettings, create_proxy_app
from tracer.testing.fake_upstream import MODEL, FakeUpstream
from tracer.web.limits import ConnectionLimits
from tracer.web.observability import ObservabilitySettings
from tracer.web.server_options import fast_server_options, uvicorn_limit_options

# The gap alone would never fire on a byte every TRICKLE_EVERY_S; the deadline must.
LIMITS = ConnectionLimits(header_timeout_s=10.0, body_timeout_s=1.0, body_deadline_s=1.5,
                          max_connections=40, keep_alive_timeout_s=5.0)
TRICKLE_EVERY_S = 0.1
# Timer lateness and the loop's other work on two shared cores.
SLACK_S = 1.5
DECLARED_BYTES = 10_000   # under every route's limit (a beacon's is 16 KiB)


@pytest.fixture(scope="module")
def upstream():
    fake = FakeUpstream(chunks=2, gap_ms=0).start()
    yield fake
    fake.stop()


def _serve(app, limits: ConnectionLimits = LIMITS) -> Served:
    return serve(app, **uvicorn_limit_options(limits, fast_server_options()))


def _proxy(upstream, limits: ConnectionLimits = LIMITS, api_key: str | None = None) -> Served:
    obs = ObservabilitySettings(api_key=api_key)
    parts = create_proxy_app(dataclasses.replace(ProxySettings(upstream.base_url),
                                                 observability=obs),
                             model_names=(MODEL,), registry=CollectorRegistry(), environ={})
    return _serve(parts.app, limits)


@pytest.fixture(scope="module")
def proxy(upstream):
    served = _proxy(upstream)
    yield served
    served.stop()


def _head(path: str, content_type: str = "application/json", extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {DECLARED_BYTES}\r\n").encode() + extra + b"\r\n"


def _trickle(sock: socket.socket, within_s: float) -> tuple[bytes, float]:
    """Send one body byte each TRICKLE_EVERY_S until the server answers or closes (each
    wait is a recv with that timeout); what it sent back and when, or (b"", inf)."""
    sock.settimeout(TRICKLE_EVERY_S)
    stop_at = time.monotonic() + within_s
    while time.monotonic() < stop_at:
        try:
            first = sock.recv(65536)
        except socket.timeout:
            try:
                sock.sendall(b"{")
            except (BrokenPipeError, ConnectionResetError):
                return read_response(sock, 2.0), time.monotonic()
            continue
        except ConnectionResetError:
            return b"", time.monotonic()
        at = time.monotonic()
        return first + (read_response(sock, 2.0) if first else b""), at
    return b"", float("inf")


def _assert_trickle_cut(served: Served, path: str, content_type: str = "application/json"):
    """Trickle a body to `path`: a 408 within the deadline plus slack, then the close. The
    response (head, body) is returned for the shape checks."""
    with served.connect() as sock:
        sock.sendall(_head(path, content_type))
        started = time.monotonic()
        response, at = _trickle(sock, LIMITS.body_deadline_s + SLACK_S + 5)
        elapsed = at - started
        assert status_of(response) == 408, (path, response[:300])
        assert LIMITS.body_deadline_s - 0.2 <= elapsed <= LIMITS.body_deadline_s + SLACK_S, \
            (path, elapsed)
        head, _, body = response.partition(b"\r\n\r\n")
        assert b"connection: close" in head.lower()
        sock.settimeout(2.0)
        try:
            assert sock.recv(1) == b""   # closed (read_response read up to the close)
        except ConnectionResetError:
            pass
    return head.lower(), body


OPENAI_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                 "/v1/probe", "/v1/embeddings"]   # the last one is the passthrough


@pytest.mark.parametrize("path", OPENAI_ROUTES)
def test_a_trickled_body_gets_408_at_the_deadline_on_every_proxy_route(proxy, path):
    head, body = _assert_trickle_cut(proxy, path)
    assert b"content-type: application/json" in head
    assert json.loads(body)["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("encoding", ["application/x-protobuf", "application/json"])
def test_a_trickled_otlp_export_gets_408_in_the_otlp_shape(proxy, encoding):
    head, body = _assert_trickle_cut(proxy, "/v1/traces", encoding)
    assert f"content-type: {encoding}".encode() in head
    # OTLP/HTTP: an error's body is a google.rpc.Status in the request's encoding.
    status = (Status.FromString(body) if encoding == "application/x-protobuf"
              else Status(**{k: v for k, v in json.loads(body).items()
                             if k in ("code", "message")}))
    assert status.code == 4 and "deadline" in status.message   # DEADLINE_EXCEEDED


def test_the_collector_and_the_engine_cut_a_trickled_body_too(loaded_model):
    from instrumented_engine.engine.config import EngineConfig
    from instrumented_engine.engine.llm_engine import LLMEngine
    from instrumented_engine.server.app import ServerSettings, create_app

    collector = _serve(create_collector_app(CollectorSettings(), registry=CollectorRegistry(),
                                            environ={}).app)
    engine = LLMEngine(EngineConfig(num_kv_blocks=64, max_num_seqs=2), loaded=loaded_model)
    engine_front = _serve(create_app(engine, ServerSettings(), registry=CollectorRegistry()).app)
    try:
        _assert_trickle_cut(collector, "/v1/traces", "application/x-protobuf")
        _assert_trickle_cut(collector, "/v1/probe")
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/probe"):
            _, body = _assert_trickle_cut(engine_front, path)
            assert json.loads(body)["error"]["code"] == "request_timeout"
    finally:
        collector.stop()
        engine_front.stop()


def test_forty_trickling_connections_leave_room_for_a_real_client(upstream):
    """The issue's attack: as many trickling exports as the cap allows. A real client
    still gets its completion: its connection reclaims the slowest stalled one."""
    served = _proxy(upstream, dataclasses.replace(LIMITS, body_deadline_s=60.0,
                                                  body_timeout_s=60.0))
    tricklers = []
    try:
        for _ in range(LIMITS.max_connections):
            sock = served.connect()
            sock.sendall(_head("/v1/traces", "application/x-protobuf") + b"\x0a")
            tricklers.append(sock)
        assert wait_until(lambda: served.num_connections() == LIMITS.max_connections, 10)
        # Each is reclaimable once it has been stalled for the grace period; the server
        # says so itself (no guess at how long that takes here).
        assert wait_until(lambda: _num_stalled(served) == LIMITS.max_connections, 10)
        for attempt in range(3):   # three real clients in a row, each a new connection
            started = time.monotonic()
            response = httpx.post(served.base_url + "/v1/chat/completions", timeout=10,
                                  json={"model": MODEL, "messages": [
                                      {"role": "user", "content": "hi"}]})
            assert response.status_code == 200, (attempt, response.text[:300])
            assert time.monotonic() - started < 2.0
        # The first client took a trickler's place (each leaves room for the next when it
        # closes): that trickler got a 408 naming why.
        reclaimed = [r for r in (read_response(sock, 0.2) for sock in tricklers) if r]
        assert reclaimed and all(status_of(r) == 408 for r in reclaimed)
        assert b"connection limit" in reclaimed[0]
    finally:
        for sock in tricklers:
            sock.close()
        served.stop()


def _num_stalled(served: Served) -> int:
    now = time.monotonic()
    return sum(connection.stalled(now) for connection in served.server.server_state.connections)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/traces"])
def test_a_401_closes_without_reading_the_body(upstream, path):
    """A refused request's 10 bytes of a declared 10 kB body: the 401 says
    `Connection: close` and the connection closes at once, the body left unread."""
    served = _proxy(upstream, api_key="right")
    try:
        with served.connect() as sock:
            sock.sendall(_head(path, extra=b"Authorization: Bearer wrong\r\n") + b"0123456789")
            sock.settimeout(5.0)
            first = sock.recv(65536)
            answered = time.monotonic()
            assert status_of(first) == 401, first[:200]
            rest = read_response(sock, 5.0)   # until the close
            closed_after_s = time.monotonic() - answered
            head = (first + rest).partition(b"\r\n\r\n")[0].lower()
            assert b"connection: close" in head
            assert closed_after_s < 1.0, closed_after_s   # was the 5 s keep-alive
    finally:
        served.stop()
