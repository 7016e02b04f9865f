"""A streamed response's body chunks written to the client's transport directly, not through
ASGI `send`: the relay's per-read path without a message dict, an awaited coroutine and the
server's checks per chunk.

nginx, with `proxy_buffering off`, writes what each upstream read brought to the client
from the same event handler (ngx_http_upstream_process_non_buffered_request: recv, then
`ngx_http_output_filter` → the chunked filter → `writev`), without a hop through any
other layer. ASGI cannot say that: each body chunk is a message to the server's `send`, a
coroutine that checks the cycle's state, frames the chunk and writes it. The relay still
starts the response (`http.response.start`) and ends it (the last body message) through
`send`, so the server knows its state; only the body chunks in between take this path.

It is used only where it is exactly what the server's own `send` would do: `send` is
uvicorn's httptools `RequestResponseCycle.send` itself (no middleware wraps it, e.g. CORS
for an allowed origin), the response has started and is chunked (not a HEAD, not a
Content-Length), and has not completed. The writes then follow uvicorn's
(uvicorn/protocols/http/httptools_impl.py, `RequestResponseCycle.send`): nothing is
written once the client has gone, each chunk is framed `<hex length>\\r\\n<bytes>\\r\\n`
onto the cycle's transport (our write-batching wrapper, tracer/web/write_batch.py, so a
held head still leaves with it), and a client whose transport asked to pause writing is
waited for: `write` then writes nothing and says so, and the caller sends that chunk through
`send`, which waits for the drain (uvicorn's flow control) before it writes.

    >>> ClientBody.of(print) is None   # not uvicorn's cycle: the relay keeps to `send`
    True
"""
from __future__ import annotations

try:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
except ImportError:   # pragma: no cover - httptools missing: uvicorn's h11 cycle, never direct
    RequestResponseCycle = None


class ClientBody:
    """The body writer of one started, chunked response on uvicorn's httptools cycle."""

    __slots__ = ("_cycle", "_flow", "_write")

    def __init__(self, cycle) -> None:
        self._cycle = cycle
        self._flow = cycle.flow             # uvicorn's FlowControl of the connection
        self._write = cycle.transport.write   # set once per request (tracer/web/http_guard.py)

    @classmethod
    def of(cls, send) -> ClientBody | None:
        """The writer behind `send`, or None where `send` must be used (see the module)."""
        cycle = getattr(send, "__self__", None)
        if (RequestResponseCycle is None or not isinstance(cycle, RequestResponseCycle)
                or getattr(send, "__func__", None) is not RequestResponseCycle.send):
            return None
        if (not cycle.response_started or cycle.response_complete
                or cycle.chunked_encoding is not True or cycle.scope.get("method") == "HEAD"):
            return None
        return cls(cycle)

    def write(self, data: bytes) -> bool:
        """Write one non-empty body chunk; False, writing nothing, while the client's
        transport asks to pause writing (send it through `send`, which waits for the drain)."""
        if self._cycle.disconnected:
            return True   # as uvicorn's send: dropped (the serving layer lets the upstream go)
        if self._flow.write_paused:
            return False
        self._write(b"%x\r\n%b\r\n" % (len(data), data))
        return True
