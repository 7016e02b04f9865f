"""The client a request came from, when it came through a trusted proxy: uvicorn's
X-Forwarded-For rule, applied by one setting (`--forwarded-allow-ips`) on every front."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracer.web.observability import ObservabilitySettings


PEER_KEY = "peer"   # scope["state"][PEER_KEY]: the TCP peer, before ForwardedClient


def add_forwarded_client(app, settings: ObservabilitySettings) -> None:
    """`scope["client"]` becomes the forwarded client when the peer is a trusted proxy
    (`ForwardedClient`), so the servers run uvicorn with `proxy_headers=False` and this one
    setting (`--forwarded-allow-ips`) decides."""
    if settings.forwarded_allow_ips:
        app.add_middleware(ForwardedClient, trusted_hosts=list(settings.forwarded_allow_ips))


class ForwardedClient:
    """uvicorn's own ProxyHeadersMiddleware (the rightmost X-Forwarded-For hop that is not a
    trusted proxy, only when the peer is trusted), keeping the TCP peer in
    `scope["state"][PEER_KEY]` for whoever appends it to X-Forwarded-For (the proxy).

    >>> from fastapi import FastAPI
    >>> app = FastAPI(); app.add_middleware(ForwardedClient, trusted_hosts=["127.0.0.1"])
    """

    def __init__(self, app, trusted_hosts: list[str]) -> None:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
        self.inner = ProxyHeadersMiddleware(app, trusted_hosts=trusted_hosts)

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope.get("client"):
            scope.setdefault("state", {})[PEER_KEY] = scope["client"]
        await self.inner(scope, receive, send)
