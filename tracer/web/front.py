"""One front assembly: the shared middleware of an HTTP front (the engine's server, the
proxy), installed in one order by `assemble_front` (docs/architecture.md, "One front
assembly").

Outermost first:

1. `ReceiveClockGate`: the receive clock starts here, before any other middleware, the
   OpenTelemetry HTTP instrumentation's included, so TTFT starts at the same point on every
   front (tests/tracer/test_front.py checks the order on each).
2. `outside_key` paths (the proxy's OTLP receiver), which check their own token.
3. `ApiKeyGate`: the path check, then the key.
4. `inside_key`: what must see the request after the key check (the proxy's upstream
   `Authorization` rule).
5. The hot-path dispatch: completion routes straight to their endpoints, without FastAPI's
   routing, when no HTTP span is made.
6. FastAPI, with the forwarded-client rule and CORS as its middleware, and the HTTP SERVER
   span when `http_spans` (with tracing on).
"""
from __future__ import annotations

from collections.abc import Callable

from opentelemetry.trace import SpanKind

from tracer.web.auth import ApiKeyGate
from tracer.web.cors import add_cors, with_cors
from tracer.web.forwarded import add_forwarded_client
from tracer.web.observability import ObservabilitySettings, ReceiveClockGate
from tracer.web.routes import serve_head


# Path prefixes that get no HTTP span: health checks, scrapes, browser beacons, the UI and
# the demo page. Which need the API key is tracer/web/auth.py's (`OPEN_PATHS`, exact paths).
NO_HTTP_SPAN_PREFIXES = ("/health", "/metrics", "/v1/probe", "/ui", "/demo", "/probe")


def request_span_kind(http_spans: bool) -> SpanKind:
    """The kind of the request's own span (`chat {model}`): one SERVER span per hop. With
    `http_spans` the FastAPI instrumentation's HTTP span is that hop's SERVER span and ours
    nests in it; without, ours is.

    >>> request_span_kind(False).name, request_span_kind(True).name
    ('SERVER', 'INTERNAL')
    """
    return SpanKind.INTERNAL if http_spans else SpanKind.SERVER


def instrument_http_spans(app, tracer_provider) -> None:
    """The HTTP SERVER span of each request (not for `NO_HTTP_SPAN_PREFIXES`); its per-message
    ASGI send/receive spans would be one span per token, so they are off."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    FastAPIInstrumentor.instrument_app(app, tracer_provider=tracer_provider,
                                       exclude_spans=["send", "receive"],
                                       excluded_urls=",".join(NO_HTTP_SPAN_PREFIXES))


def assemble_front(app, settings: ObservabilitySettings, *, tracer_provider, http_spans: bool,
                   hot_paths: dict | None = None,
                   inside_key: Callable[[object], object] | None = None,
                   outside_key: dict | None = None):
    """The ASGI app to serve: `app` (a FastAPI app, its routes all in: each GET route also
    answers HEAD, tracer/web/routes.py) inside the shared middleware."""
    origins = settings.cors_origins
    serve_head(app)
    add_cors(app, origins)
    add_forwarded_client(app, settings)
    front = app
    if settings.tracing and http_spans:
        instrument_http_spans(app, tracer_provider)   # needs every request in FastAPI
    elif hot_paths:
        front = HotPathDispatch(app, {path: with_cors(endpoint, origins)
                                      for path, endpoint in hot_paths.items()})
    if inside_key is not None:
        front = inside_key(front)
    front = ApiKeyGate(front, settings.api_key)
    if outside_key:
        front = PathDispatch(front, outside_key)
    return ReceiveClockGate(front, cors_origins=origins)


class HotPathDispatch:
    """ASGI: a POST to one of `endpoints`' paths goes straight to its endpoint; anything
    else to `app`. FastAPI's middleware and routing cost ~0.1 ms per request and a wrapper
    call per relayed chunk, which the completion paths (the TTFT path) do without.

    >>> HotPathDispatch(app=None, endpoints={"/v1/completions": None}).endpoints
    {'/v1/completions': None}
    """

    def __init__(self, app, endpoints: dict) -> None:
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                return await endpoint(scope, receive, send)
        await self.app(scope, receive, send)


class PathDispatch:
    """ASGI: any request to one of `paths` goes to its app (whatever the method: the app
    answers 405 itself); anything else to `app`.

    >>> PathDispatch(app=None, paths={"/v1/traces": None}).paths
    {'/v1/traces': None}
    """

    def __init__(self, app, paths: dict) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            target = self.paths.get(scope["path"])
            if target is not None:
                return await target(scope, receive, send)
        await self.app(scope, receive, send)
