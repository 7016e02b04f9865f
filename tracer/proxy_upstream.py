"""The proxy's side of the upstream hop: a pooled httpx client, header hygiene, timing hooks.

httpcore reports connection events through the request extension `trace` (an async
callback in an AsyncClient); they give the two upstream boundaries the proxy can see
exactly: the request sent on a connection (`upstream_connect` ends) and the response
headers received (`upstream_ttfb` ends). A pooled connection has no connect events; a new
one adds `connect_tcp` timings to the stage's attributes.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterable, Callable, Iterable
from dataclasses import dataclass

import httpx

# RFC 9110 §7.6.1 hop-by-hop fields, plus ones the client library sets for its own hop.
HOP_BY_HOP = frozenset((
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
))
_REQUEST_SENT = "http11.send_request_body.complete"
_HEADERS_RECEIVED = "http11.receive_response_headers.complete"
_CONNECT_STARTED = "connection.connect_tcp.started"
_CONNECT_DONE = "connection.connect_tcp.complete"


class UpstreamFailure(Exception):
    """The upstream could not be asked or did not answer: the proxy's own error response.

    `status` is what the client gets (502: refused or broken, 504: timed out) and
    `error_type` what the metrics count.

    >>> UpstreamFailure(504, "timeout", "upstream timed out").status
    504
    """

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


@dataclass(slots=True, frozen=True)
class UpstreamLimits:
    """Timeouts and pool size of the upstream client.

    `read_timeout_s` bounds the wait for the response headers and every gap between body
    chunks: a non-streamed completion sends its headers only when generation is done.

    >>> UpstreamLimits(read_timeout_s=30.0).connect_timeout_s
    5.0
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    write_timeout_s: float = 30.0
    pool_timeout_s: float = 30.0
    max_connections: int = 512           # over all shards
    max_keepalive_connections: int = 128
    keepalive_expiry_s: float = 30.0
    # httpcore 1.0 re-scans its whole pool (O(connections²) calls, and a poll() per idle
    # socket) at every request start and end (encode/httpx#3215, encode/httpcore#1035):
    # at 32 streams that was half the proxy's CPU. Several small pools, used in turn,
    # keep each scan short.
    num_pool_shards: int = 8


class Upstream:
    """One upstream base URL behind pooled `httpx.AsyncClient`s (`num_pool_shards` of them,
    used round-robin; one when a transport is injected).

    >>> upstream = Upstream("http://127.0.0.1:8000", UpstreamLimits(connect_timeout_s=1.0))
    >>> upstream.url("/v1/models", b"a=1")
    'http://127.0.0.1:8000/v1/models?a=1'
    """

    def __init__(self, base_url: str, limits: UpstreamLimits = UpstreamLimits(), *,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self.base_url = base_url.rstrip("/")
        self.limits = limits
        self.clock_ns = clock_ns
        timeout = httpx.Timeout(connect=limits.connect_timeout_s, read=limits.read_timeout_s,
                                write=limits.write_timeout_s, pool=limits.pool_timeout_s)
        num_shards = 1 if transport is not None else max(limits.num_pool_shards, 1)
        pool = httpx.Limits(
            max_connections=max(limits.max_connections // num_shards, 1),
            max_keepalive_connections=max(limits.max_keepalive_connections // num_shards, 1),
            keepalive_expiry=limits.keepalive_expiry_s)
        transports = [transport] if transport is not None else [
            httpx.AsyncHTTPTransport(limits=pool, retries=0) for _ in range(num_shards)]
        # trust_env=False: HTTP(S)_PROXY from the environment must not reroute the upstream.
        self.clients = [httpx.AsyncClient(timeout=timeout, transport=t, trust_env=False,
                                          follow_redirects=False) for t in transports]
        self._next_shard = 0

    def url(self, path: str, query: bytes = b"") -> str:
        return self.base_url + path + (("?" + query.decode("latin-1")) if query else "")

    async def send(self, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                   content: bytes | AsyncIterable[bytes] | None,
                   timeline=None) -> httpx.Response:
        """Send and return once the response headers are in (the body is not read).

        Marks `upstream_connect` and `upstream_ttfb` on `timeline` when one is given.
        Raises `UpstreamFailure` when no response arrives.
        """
        extensions = {} if timeline is None else {"trace": _timing_hook(timeline, self.clock_ns)}
        client = self.clients[self._next_shard]
        self._next_shard = (self._next_shard + 1) % len(self.clients)
        request = client.build_request(method, self.url(path, query), headers=headers,
                                       content=content, extensions=extensions)
        try:
            return await client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamFailure(504, "timeout", f"upstream timed out "
                                  f"({type(exc).__name__})") from exc
        except httpx.ConnectError as exc:
            raise UpstreamFailure(502, "upstream_unavailable",
                                  f"upstream unreachable: {exc}") from exc
        except httpx.TransportError as exc:
            raise UpstreamFailure(502, "upstream", f"upstream failed before answering "
                                  f"({type(exc).__name__}: {exc})") from exc

    def pool_state(self) -> tuple[int, int]:
        """(connections in the pools, connections busy with a request) — for tests and drains."""
        connections = [c for client in self.clients
                       for c in getattr(getattr(client._transport, "_pool", None),
                                        "connections", ())]
        return len(connections), sum(1 for c in connections if not c.is_idle())

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


def _timing_hook(timeline, clock_ns: Callable[[], int]):
    """The httpcore trace callback of one request: boundary marks on its timeline."""
    connect_started_ns = None

    async def hook(event: str, info: dict) -> None:
        nonlocal connect_started_ns
        if event == _REQUEST_SENT:
            timeline.mark("upstream_connect", clock_ns())
        elif event == _HEADERS_RECEIVED:
            timeline.mark("upstream_ttfb", clock_ns())
        elif event == _CONNECT_STARTED:
            connect_started_ns = clock_ns()
            timeline.stage_attr("upstream_connect", "new_connection", True)
        elif event == _CONNECT_DONE and connect_started_ns is not None:
            timeline.stage_attr("upstream_connect", "tcp_connect_ms",
                                (clock_ns() - connect_started_ns) / 1e6)
    return hook


def forward_headers(raw: Iterable[tuple[bytes, bytes]], *, drop: frozenset[str] = frozenset(),
                    ) -> list[tuple[str, str]]:
    """End-to-end request headers to pass on, without hop-by-hop ones and `drop`.

    Fields named in the request's own `Connection` header are hop-by-hop too (RFC 9110).
    """
    pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw]
    named = {token.strip().lower() for k, v in pairs if k == "connection" for token in v.split(",")}
    skip = HOP_BY_HOP | named | drop
    return [(k, v) for k, v in pairs if k not in skip]


def response_headers(headers: httpx.Headers, *, drop: frozenset[str] = frozenset(),
                     ) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers for the client, raw, minus hop-by-hop and `drop`."""
    named = {t.strip().lower() for v in headers.get_list("connection") for t in v.split(",")}
    skip = (HOP_BY_HOP - {"content-length"}) | named | drop
    return [(k.lower(), v) for k, v in headers.raw if k.decode("latin-1").lower() not in skip]
