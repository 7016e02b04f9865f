"""The one CORS policy of every ttftscope HTTP front (engine, proxy, collector).

Allow-listed origins only. A browser page may send the trace context (`traceparent`,
`tracestate`) and the API key, and read `Server-Timing` and `X-Request-Id`, which is how the
probe learns the server's trace. Credentials are allowed because `navigator.sendBeacon`
always sends in `include` mode: without `Access-Control-Allow-Credentials` a JSON beacon's
preflight fails. No origin is allowed by default, and `*` is never sent.
"""
from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware

ALLOW_METHODS = ("GET", "POST", "OPTIONS")
# x-ttft-timing: the probe's opt-in to the in-band timing line (docs/reference.md)
ALLOW_HEADERS = ("authorization", "content-type", "traceparent", "tracestate", "x-ttft-timing")
EXPOSE_HEADERS = ("Server-Timing", "X-Request-Id")


def with_cors(asgi_app, cors_origins: tuple[str, ...]):
    """`asgi_app` behind the CORS policy; unchanged when no origin is allowed.

    >>> with_cors("app", ())
    'app'
    >>> type(with_cors("app", ("https://chat.example",))).__name__
    'CORSMiddleware'
    """
    return CORSMiddleware(asgi_app, **_options(cors_origins)) if cors_origins else asgi_app


def add_cors(app, cors_origins: tuple[str, ...]) -> None:
    """`with_cors` as a FastAPI/Starlette middleware."""
    if cors_origins:
        app.add_middleware(CORSMiddleware, **_options(cors_origins))


def _options(cors_origins: tuple[str, ...]) -> dict:
    return dict(allow_origins=list(cors_origins), allow_methods=list(ALLOW_METHODS),
                allow_headers=list(ALLOW_HEADERS), expose_headers=list(EXPOSE_HEADERS),
                allow_credentials=True, max_age=600)
