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
