"""For your own Python web backend (FastAPI, Starlette, any ASGI app): the `Server-Timing`
header the probe needs when no ttftscope server answers the browser (docs/backends.md,
"No ttftscope in the path").

    from tracer.web.backend_timing import ServerTimingMiddleware
    app = FastAPI()
    app.add_middleware(ServerTimingMiddleware, beacon_key=os.environ["TTFTSCOPE_BEACON_KEY"])
    FastAPIInstrumentor.instrument_app(app)

Each response gets `Server-Timing: trace;desc=<traceparent>, beacon;desc=<token>` (W3C Trace
Context's response convention; tracer/record/traceparent.py) and `Server-Timing` in
`Access-Control-Expose-Headers`, so a cross-origin page can read it. The traceparent is the
backend's current OpenTelemetry span (the instrumentation's server span, which the
middleware runs inside) or, without one, the browser's own `traceparent`. The token is the
beacon key's HMAC of the trace id (tracer/web/probe/token.py): the collector, given the same
`--beacon-key`, accepts the beacon that returns it and no other, so a beacon stays authentic
with no ttftscope component in the data path. Pure ASGI: the body is never touched or held.
"""
from __future__ import annotations

from tracer.record.traceparent import format_traceparent, parse_traceparent, server_timing_value
from tracer.web.openai_http import header_value
from tracer.web.probe.token import BeaconSigner

_EXPOSE = b"access-control-expose-headers"


class ServerTimingMiddleware:
    """ASGI middleware signing each HTTP response's trace for the probe.

    >>> import asyncio
    >>> async def app(scope, receive, send):
    ...     await send({"type": "http.response.start", "status": 200, "headers": []})
    >>> sent = []
    >>> async def send(message): sent.append(message)
    >>> tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    >>> scope = {"type": "http", "headers": [(b"traceparent", tp)]}
    >>> asyncio.run(ServerTimingMiddleware(app, beacon_key="k")(scope, None, send))
    >>> trace, beacon = dict(sent[0]["headers"])[b"server-timing"].decode().split(", ")
    >>> trace, beacon == "beacon;desc=" + BeaconSigner(b"k").token("4bf92f3577b34da6a3ce929d0e0e4736")
    ('trace;desc=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', True)
    """

    def __init__(self, app, *, beacon_key: str | bytes) -> None:
        if not beacon_key:
            raise ValueError("ServerTimingMiddleware needs the collector's beacon key")
        self.app = app
        self.signer = BeaconSigner.from_setting(beacon_key)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_signed(message) -> None:
            if message["type"] == "http.response.start":
                traceparent = _current_traceparent(scope)
                if traceparent is not None:
                    trace_id = traceparent.split("-")[1]
                    headers = [(k, v) for k, v in message.get("headers", ())
                               if k.lower() != _EXPOSE]
                    exposed = [v for k, v in message.get("headers", ()) if k.lower() == _EXPOSE]
                    headers.append((b"server-timing", server_timing_value(
                        traceparent, self.signer.token(trace_id)).encode("ascii")))
                    headers.append((_EXPOSE, b", ".join(exposed + [b"Server-Timing"])))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_signed)


def _current_traceparent(scope) -> str | None:
    """The active OpenTelemetry span's context, else the request's valid `traceparent`."""
    try:
        from opentelemetry import trace
    except ImportError:   # a backend without OpenTelemetry: the browser's context
        trace = None
    if trace is not None:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            return format_traceparent(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}",
                                      bool(ctx.trace_flags & 1))
    raw = header_value(scope, b"traceparent")
    parent = parse_traceparent(raw.decode("latin-1")) if raw else None
    return None if parent is None else format_traceparent(parent.trace_id, parent.span_id,
                                                          parent.sampled)
