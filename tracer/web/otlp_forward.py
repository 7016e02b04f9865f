"""The receiver's tee: every accepted OTLP/HTTP export goes on, unchanged, to the process's
own OTLP destination (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
`OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`), so pointing an engine at the proxy loses
nothing in Tempo or the Collector.

Unchanged means the bytes as they arrived, with their `Content-Type` and
`Content-Encoding`: a gzip-compressed protobuf body is forwarded compressed, never decoded
and re-encoded. The engine's export is answered before the forward happens: a slow or dead
destination costs the engines nothing. Forwarding is bounded by the bytes waiting
(`max_queued_bytes`); an export that would exceed it is dropped and counted
(`llm_otlp_forward_total{outcome="dropped"}`), as is one the destination refuses
(`failed`). No retries: the destination's own exporters retry, this is a relay.
"""
from __future__ import annotations

import asyncio
import collections
import os
from urllib.parse import unquote

import httpx
from prometheus_client import CollectorRegistry, Counter

from tracer.sinks.tracer_provider import otlp_traces_endpoint

FORWARD_OUTCOMES = ("sent", "failed", "dropped")
DEFAULT_MAX_QUEUED_BYTES = 64 << 20
_TIMEOUT_S = 10.0


def otlp_headers(environ=os.environ) -> dict[str, str]:
    """`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`, parsed as the
    OTel spec says (comma-separated `key=value`, percent-decoded).

    >>> otlp_headers({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20x, x-a=1"})
    {'authorization': 'Bearer x', 'x-a': '1'}
    """
    raw = environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", "")
    out = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[unquote(key.strip()).lower()] = unquote(value.strip())
    return out


class OtlpForwarder:
    """Forwards bodies from the event loop, one POST at a time, in arrival order.

    >>> OtlpForwarder.from_environ({}, CollectorRegistry()) is None
    True
    """

    def __init__(self, endpoint: str, registry: CollectorRegistry, *,
                 headers: dict[str, str] | None = None,
                 max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
                 transport: httpx.AsyncBaseTransport | None = None,
                 metric: str = "llm_otlp_forward",
                 what: str = "OTLP exports the receiver passed on to its own destination") -> None:
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self.max_queued_bytes = max_queued_bytes
        self._transport = transport
        counter = Counter(metric, f"{what}, by outcome", ("outcome",), registry=registry)
        self._outcome = {o: counter.labels(o) for o in FORWARD_OUTCOMES}
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None
        self._idle: asyncio.Event | None = None

    @classmethod
    def from_environ(cls, environ, registry: CollectorRegistry) -> OtlpForwarder | None:
        endpoint = otlp_traces_endpoint(environ)
        if endpoint is None:
            return None
        return cls(endpoint, registry, headers=otlp_headers(environ))

    def submit(self, body: bytes, content_type: str, content_encoding: str | None) -> None:
        """Queue one body (on the event loop); returns at once."""
        if self._queued_bytes + len(body) > self.max_queued_bytes:
            self._outcome["dropped"].inc()
            return
        headers = {"content-type": content_type}
        if content_encoding:
            headers["content-encoding"] = content_encoding
        self._queue.append((body, headers))
        self._queued_bytes += len(body)
        if self._task is None or self._task.done():
            self._wake, self._idle = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._idle.clear()
        self._wake.set()

    async def _run(self) -> None:
        self._client = httpx.AsyncClient(timeout=_TIMEOUT_S, trust_env=False,
                                         transport=self._transport)
        try:
            while True:
                while self._queue:
                    body, headers = self._queue.popleft()
                    try:
                        response = await self._client.post(
                            self.endpoint, content=body, headers={**self.headers, **headers})
                        ok = response.status_code < 300
                    except httpx.HTTPError:
                        ok = False
                    finally:
                        self._queued_bytes -= len(body)
                    self._outcome["sent" if ok else "failed"].inc()
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
        finally:
            await self._client.aclose()

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued body has been posted (tests, shutdown)."""
        if self._task is None or not self._queue and self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def aclose(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
