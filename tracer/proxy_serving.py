"""The proxy's request flow: read → trace → forward → relay, for completions; plain relay
for everything else.

The proxy owns the `receive` stage (ASGI entry → body read and its JSON checked for the
model and the stream flag); `tracer.proxy_upstream` marks `upstream_connect` and
`upstream_ttfb`; `tracer.proxy_stream` marks `upstream_first_token` and `send`.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from tracer.app_wiring import RECEIVE_START_KEY
from tracer.core import OTHER_MODEL, ActiveRequest, Tracer
from tracer.openai_http import OpenAIError, parent_traceparent, read_body
from tracer.proxy_stream import Relay, RelayResponse
from tracer.proxy_upstream import Upstream, UpstreamFailure, forward_headers

# The proxy continues the trace itself, and reads the SSE itself (so: no compression).
_REPLACED_REQUEST_HEADERS = frozenset(("traceparent", "accept-encoding", "x-forwarded-for"))


# The OpenAI-shaped error the proxy answers itself (shared with the engine server).
ProxyError = OpenAIError


@dataclass(slots=True, frozen=True)
class RequestFields:
    """The few request fields the proxy reads: the rest goes upstream untouched.

    >>> peek_request(b'{"model": "m", "stream": true, "max_tokens": 8}').attrs
    {'stream': True, 'gen_ai.request.max_tokens': 8}
    """

    model: str | None
    stream: bool
    attrs: dict


def peek_request(body: bytes) -> RequestFields:
    """The model, the stream flag and the span's request attributes, or a 400."""
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise ProxyError(400, f"the request body is not valid JSON: {exc}",
                         code="invalid_json") from None
    if not isinstance(obj, dict):
        raise ProxyError(400, "the request body must be a JSON object", code="invalid_json")
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    attrs = {"stream": obj.get("stream") is True}
    for field, key in (("max_tokens", "gen_ai.request.max_tokens"),
                       ("temperature", "gen_ai.request.temperature"),
                       ("top_p", "gen_ai.request.top_p")):
        value = obj.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[key] = value
    return RequestFields(model, obj.get("stream") is True, attrs)


class ProxyServing:
    """Completions through the upstream, traced; any other path relayed untraced.

    >>> serving = ProxyServing(upstream, tracer, max_body_bytes=1 << 20)  # doctest: +SKIP
    >>> response = await serving.completion(request, operation="chat")  # doctest: +SKIP
    """

    def __init__(self, upstream: Upstream, tracer: Tracer, *, max_body_bytes: int,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self.upstream = upstream
        self.tracer = tracer
        self.max_body_bytes = max_body_bytes
        self.clock_ns = clock_ns
        self._served = frozenset(tracer.model_names)

    async def completion(self, request: Request, *, operation: str) -> Response:
        start_ns = request.scope.get("state", {}).get(RECEIVE_START_KEY) or self.clock_ns()
        try:
            body = await read_body(request, self.max_body_bytes)
            fields = peek_request(body)
        except ProxyError as exc:
            return exc.response()
        model = fields.model if fields.model in self._served else OTHER_MODEL
        request_id = f"proxy-{uuid.uuid4().hex}"
        active = self.tracer.begin(request_id=request_id, model=model, operation=operation,
                                   traceparent=parent_traceparent(request), start_ns=start_ns,
                                   attrs={**fields.attrs, "llm.upstream.url": self.upstream.base_url})
        active.timeline.mark("receive", self.clock_ns())
        headers = forward_headers(request.scope["headers"], drop=_REPLACED_REQUEST_HEADERS)
        headers += [("traceparent", active.traceparent), ("accept-encoding", "identity"),
                    *_forwarded_for(request)]
        ours = {"Server-Timing": active.server_timing, "X-Request-Id": request_id}
        try:
            response = await _send_unless_disconnected(
                request, self.upstream.send("POST", _raw_path(request),
                                            request.scope.get("query_string", b""),
                                            headers, body, active.timeline))
        except UpstreamFailure as failure:
            self._finish_failed(active, "error", failure.error_type)
            return ProxyError(failure.status, failure.message, code=failure.error_type,
                              type_="upstream_error").response(ours)
        except _ClientGone:
            self._finish_failed(active, "abort", "abort")
            # Nobody reads it; 499 is what nginx logs for a client that closed early.
            return Response(status_code=499, headers=ours)
        except BaseException:   # cancelled (server shutdown): still one record
            self._finish_failed(active, "abort", "abort")
            raise
        relay = Relay(response, active, self._finish_relay, clock_ns=self.clock_ns)
        return RelayResponse(relay, [(k.lower().encode(), v.encode()) for k, v in ours.items()])

    async def passthrough(self, request: Request) -> Response:
        """Any other path (e.g. /v1/models): forwarded as is, untraced by us; the trace
        context passed on is the HTTP span's when there is one, else the client's."""
        try:
            body = await read_body(request, self.max_body_bytes)
        except ProxyError as exc:
            return exc.response()
        headers = forward_headers(request.scope["headers"], drop=_REPLACED_REQUEST_HEADERS -
                                  {"accept-encoding"})
        parent = parent_traceparent(request)   # the HTTP span, when instrumented
        if parent:
            headers.append(("traceparent", parent))
        try:
            response = await self.upstream.send(
                request.method, _raw_path(request), request.scope.get("query_string", b""),
                [*headers, *_forwarded_for(request)], body or None)
        except UpstreamFailure as failure:
            return ProxyError(failure.status, failure.message, code=failure.error_type,
                              type_="upstream_error").response()
        return RelayResponse(Relay(response, None, lambda *args: None, clock_ns=self.clock_ns))

    def _finish_failed(self, active: ActiveRequest, finish_reason: str, error_type: str) -> None:
        self.tracer.finish(active, end_ns=self.clock_ns(), finish_reason=finish_reason,
                           error_type=error_type)

    def _finish_relay(self, relay: Relay, finish_reason: str, error_type: str | None,
                      end_ns: int) -> None:
        active = relay.active
        active.attrs.update(relay.upstream_attrs())
        timings = relay.summary.timings
        if timings and relay.end_ns is not None:
            active.timeline.event("upstream_timings", relay.end_ns, **{
                str(k)[:64]: v for k, v in timings.items() if isinstance(v, (int, float))})
        num_prompt, num_cached, num_output = relay.token_counts()
        self.tracer.finish(active, end_ns=end_ns, finish_reason=finish_reason,
                           error_type=error_type, num_prompt_tokens=num_prompt,
                           num_cached_tokens=num_cached, num_output_tokens=num_output)


async def _send_unless_disconnected(request: Request, sending):
    """Await the upstream's response headers, unless the client disconnects first: then the
    upstream request is cancelled (its connection closed) instead of running on unread."""
    send_task = asyncio.ensure_future(sending)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    watcher.add_done_callback(lambda _: send_task.cancel())   # a no-op once it is done
    try:
        return await send_task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise _ClientGone() from None
        raise
    finally:
        watcher.cancel()


class _ClientGone(Exception):
    """The client disconnected before the upstream's response headers arrived."""


async def _wait_disconnect(request: Request) -> None:
    # The body has been read in full, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _raw_path(request: Request) -> str:
    # The path as the client sent it (percent-escapes untouched), not a re-encoded URL.
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1") if raw else request.scope["path"]


def _forwarded_for(request: Request) -> list[tuple[str, str]]:
    prior = request.headers.get("x-forwarded-for")
    host = request.client.host if request.client else None
    if host is None:
        return [("x-forwarded-for", prior)] if prior else []
    return [("x-forwarded-for", f"{prior}, {host}" if prior else host)]
