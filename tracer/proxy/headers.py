"""Which header fields cross the proxy: end-to-end ones pass, hop-by-hop ones stop
(RFC 9110 §7.6.1), in both directions."""
from __future__ import annotations

from collections.abc import Iterable

# RFC 9110 §7.6.1 hop-by-hop fields, plus the ones the proxy sets for its own hop.
HOP_BY_HOP = frozenset((
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
))


def forward_headers(raw: Iterable[tuple[bytes, bytes]], *, drop: frozenset[str] = frozenset(),
                    ) -> list[tuple[str, str]]:
    """End-to-end request headers to pass on, without hop-by-hop ones and `drop`.

    Fields named in the request's own `Connection` header are hop-by-hop too (RFC 9110).

    >>> forward_headers([(b"Connection", b"x-a"), (b"X-A", b"1"), (b"Accept", b"*/*")])
    [('accept', '*/*')]
    """
    pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw]
    named = {token.strip().lower() for k, v in pairs if k == "connection" for token in v.split(",")}
    skip = HOP_BY_HOP | named | drop
    return [(k, v) for k, v in pairs if k not in skip]


def response_headers(headers: list[tuple[bytes, bytes]], *, drop: frozenset[str] = frozenset(),
                     ) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers for the client (names lower-cased, as ASGI wants),
    minus hop-by-hop ones and `drop`; `content-length` stays unless dropped.

    >>> response_headers([(b"Content-Type", b"text/plain"), (b"Connection", b"close")])
    [(b'content-type', b'text/plain')]
    """
    named = {t.strip().lower() for k, v in headers if k.lower() == b"connection"
             for t in v.decode("latin-1").split(",")}
    skip = (HOP_BY_HOP - {"content-length"}) | named | drop
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower.decode("latin-1") not in skip:
            out.append((lower, value))
    return out


# Headers the proxy answers with itself: its own trace context, request id, date and server.
# An upstream that echoes the request's `traceparent` would hand the client the engine
# join's secret parent id (tracer/proxy/engine_join.py): never relayed.
_REPLACED = frozenset(("server-timing", "x-request-id", "date", "server", "traceparent"))


def relayed_headers(headers: list[tuple[bytes, bytes]], streamed: bool,
                    extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's response headers for an upstream answer with `headers`, then `extra`
    (the proxy's own). A stream goes out chunked, as it arrives; any other body keeps its
    declared length.

    >>> relayed_headers([(b"Content-Length", b"9"), (b"Date", b"x")], True, [(b"a", b"1")])
    [(b'x-accel-buffering', b'no'), (b'a', b'1')]
    """
    if not streamed:
        return [*response_headers(headers, drop=_REPLACED), *extra]
    # nginx buffers a proxied response unless told not to: an upstream that does not say
    # so itself gets the header from us (docs/reference.md, "Buffering").
    says = next((v for name, v in headers if name.lower() == b"x-accel-buffering"), None)
    own = [] if says else [(b"x-accel-buffering", b"no")]
    return [*response_headers(headers, drop=_REPLACED | {"content-length"}), *own, *extra]


class UpstreamAuthorization:
    """ASGI, inside the API key gate: the `Authorization` the upstream gets.

    - `upstream_api_key` set: `Bearer <it>`, whatever the client sent.
    - else, the proxy has its own key: none (the client's header is the proxy's key, which
      is not the upstream's business).
    - else: the client's, unchanged (the proxy is transparent).
    docs/reference.md, "Access, beacon tokens and connection limits".

    >>> UpstreamAuthorization(None, proxy_api_key=None, upstream_api_key=None).replace
    False
    >>> UpstreamAuthorization(None, proxy_api_key="p", upstream_api_key="u").value
    b'Bearer u'
    """

    __slots__ = ("app", "replace", "value")

    def __init__(self, app, *, proxy_api_key: str | None, upstream_api_key: str | None) -> None:
        self.app = app
        self.replace = bool(proxy_api_key or upstream_api_key)
        self.value = f"Bearer {upstream_api_key}".encode("latin-1") if upstream_api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if self.replace and scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
            if self.value is not None:
                headers.append((b"authorization", self.value))
            scope["headers"] = headers
        await self.app(scope, receive, send)
