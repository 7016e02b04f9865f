"""The proxy's request flow: read → trace → forward → relay, for completions; plain relay
for everything else. Raw ASGI, no Request or Response objects: this is the hot path.

The proxy owns the `receive` stage (ASGI entry → body read and its JSON checked for the
model and the stream flag), and names `upstream_connect` and `upstream_ttfb` from the times
the exchange reports (`tracer.proxy.upstream` knows no stage); `tracer.proxy.stream` marks
`upstream_first_token` and `send`. How a request ended is decided once,
`tracer.proxy.relay_outcome.request_outcome`.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import ClientDisconnect

from tracer.core.request_tracer import ActiveRequest, Tracer
from tracer.engines import llamacpp, ollama, tgi, vllm_metrics
from tracer.proxy.engine_join import EngineJoin
from tracer.proxy.headers import forward_headers
from tracer.proxy.http1 import ResponseHead
from tracer.proxy.relay_outcome import request_outcome
from tracer.proxy.stream import Relay
from tracer.proxy.upstream import Upstream, UpstreamExchange
from tracer.proxy.upstream_errors import UpstreamFailure
from tracer.record.ids import new_request_id
from tracer.record.prompt_overlap import MAX_PROMPT_SOURCE_BYTES
from tracer.sinks.server_span import continued_parent
from tracer.web.inband import InbandTimer, wants_timing
from tracer.web.forwarded import PEER_KEY
from tracer.web.observability import RECEIVE_START_KEY
from tracer.web.openai_http import OpenAIError, header_value, parent_traceparent_of, read_asgi_body
from tracer.web.write_batch import write_batch_hold

# The proxy continues the trace itself, and reads the SSE itself (so: no compression). It
# answers the in-band timing opt-in itself, with its own line, so the header stops here.
_REPLACED_REQUEST_HEADERS = frozenset(("traceparent", "accept-encoding", "x-forwarded-for",
                                       "x-ttft-timing"))


# llama.cpp's `timings` has about ten numbers: an object with more keeps its first ones.
_MAX_TIMINGS_FIELDS = 32

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
    # The request body itself, for the TTFT diagnosis' prompt overlap, which reads its prompt
    # fields on the tracer's worker (tracer/record/prompt_overlap.py, `prompt_text`): the raw
    # bytes, never the parsed objects, which take up to ten times more while a record waits
    # for its engine's span or its verdict. None for a body over its size bound.
    prompt: object = None


def peek_request(body: bytes, *, stream_default: bool = False) -> RequestFields:
    """The model, the stream flag and the span's request attributes, or a 400.
    `stream_default`: the stream flag when the body has none (Ollama's native API streams
    unless told `"stream": false`, ollama/ollama api/types.go, `ChatRequest.Stream`).

    >>> peek_request(b'{"model": "m"}', stream_default=True).stream
    True
    """
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise ProxyError(400, f"the request body is not valid JSON: {exc}",
                         code="invalid_json") from None
    except RecursionError:
        # Nesting deeper than the interpreter's stack (~1,000 arrays) is no request anyone
        # sends; the engine answers it the same way.
        raise ProxyError(400, "the request body is not valid JSON: nested too deeply",
                         code="invalid_json") from None
    if not isinstance(obj, dict):
        raise ProxyError(400, "the request body must be a JSON object", code="invalid_json")
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    stream = obj.get("stream") is True or stream_default and obj.get("stream") is not False
    attrs = {"stream": stream}
    for field, key in (("max_tokens", "gen_ai.request.max_tokens"),
                       ("max_output_tokens", "gen_ai.request.max_tokens"),   # Responses API
                       ("temperature", "gen_ai.request.temperature"),
                       ("top_p", "gen_ai.request.top_p")):
        value = obj.get(field)
        if _span_number(value):
            attrs[key] = value
    prompt = body if len(body) <= MAX_PROMPT_SOURCE_BYTES else None
    return RequestFields(model, stream, attrs, prompt)


def _span_number(value) -> bool:
    """Whether a request number may go on the span as is: an int that fits OTLP's int64, or
    a finite float. The upstream judges the request; the span records only what it can carry
    (Python's JSON reads `1e400` as inf, accepts `NaN`, and has no int bound).

    >>> [_span_number(v) for v in (8, 0.5, True, 2**63, -2**63, float("nan"), 1e400, "8")]
    [True, True, False, False, True, False, False, False]
    """
    if type(value) is int:
        return -(1 << 63) <= value < (1 << 63)
    return type(value) is float and math.isfinite(value)


class ProxyServing:
    """Completions through the upstream, traced; any other path relayed untraced. Both are
    ASGI callables' bodies: `await serving.completion(scope, receive, send, operation=...)`.

    Built by `tracer.proxy.app.create_proxy_app`::

        serving = ProxyServing(upstream, obs.tracer, max_body_bytes=1 << 20)
    """

    def __init__(self, upstream: Upstream, tracer: Tracer, *, max_body_bytes: int,
                 clock_ns: Callable[[], int] = time.perf_counter_ns,
                 inband: InbandTimer | None = None, join: EngineJoin | None = None) -> None:
        self.upstream = upstream
        # Holds each record until its engine's span comes (tracer/proxy/engine_join.py).
        self.join = join
        self.inband = inband   # the `: ttft-timing` line, for `X-TTFT-Timing: 1` requests
        self.tracer = tracer
        self.max_body_bytes = max_body_bytes
        self.clock_ns = clock_ns

    async def completion(self, scope, receive, send, *, operation: str,
                         fmt: str | None = None) -> None:
        """One traced request; `fmt` is its answer's stream format when the route is not
        OpenAI chat/completions (tracer/proxy/formats.py)."""
        start_ns = scope.get("state", {}).get(RECEIVE_START_KEY) or self.clock_ns()
        try:
            if fmt == "ollama" and self.inband is not None and wants_timing(scope):
                # The in-band line is an SSE comment; an NDJSON stream has no place for it.
                raise ProxyError(400, "X-TTFT-Timing is not supported on Ollama's NDJSON "
                                 "routes", code="unsupported_option")
            body = await read_asgi_body(scope, receive, self.max_body_bytes)
            fields = peek_request(body, stream_default=fmt == "ollama")
        except ProxyError as exc:
            return await exc.response()(scope, receive, send)
        except ClientDisconnect:
            return
        request_id = new_request_id("proxy")
        active = self.tracer.begin(request_id=request_id, model=fields.model or "",
                                   operation=operation,
                                   traceparent=parent_traceparent_of(scope), start_ns=start_ns,
                                   attrs={**fields.attrs, "llm.upstream.url": self.upstream.base_url})
        active.timeline.mark("receive", self.clock_ns())
        active.prompt_source = fields.prompt   # read off this thread by the diagnosis
        # With the join, the upstream's parent id is a secret the client never sees.
        upstream_parent = active.traceparent if self.join is None else self.join.expect(active)
        headers = forward_headers(scope["headers"], drop=_REPLACED_REQUEST_HEADERS)
        headers += [("traceparent", upstream_parent), ("accept-encoding", "identity"),
                    *_forwarded_for(scope)]
        exchange = self.upstream.exchange("POST", _raw_path(scope), scope.get("query_string", b""),
                                          headers, body)

        def ours() -> list[tuple[bytes, bytes]]:
            # Built once the request has gone upstream (the beacon token's HMAC among them).
            return [(b"server-timing", active.server_timing.encode("latin-1")),
                    (b"x-request-id", request_id.encode("latin-1"))]
        timing = None
        if self.inband is not None and wants_timing(scope):
            timing = lambda: self.inband.line(active)   # noqa: E731 - built at the end
        relay = None
        try:
            relay = await self._relay(exchange, scope, receive, send, active, ours, timing, fmt)
        finally:
            if relay is None:
                finish_reason, error_type = request_outcome(None, exchange.failure)
                self._finish(active, end_ns=self.clock_ns(), finish_reason=finish_reason,
                             error_type=error_type)
            else:
                self._finish_relay(relay)

    async def passthrough(self, scope, receive, send) -> None:
        """Any other path (e.g. /v1/models): forwarded as is, untraced by us; the trace
        context passed on is the HTTP span's when there is one, else the client's."""
        try:
            body = await read_asgi_body(scope, receive, self.max_body_bytes)
        except ProxyError as exc:
            return await exc.response()(scope, receive, send)
        except ClientDisconnect:
            return
        headers = forward_headers(scope["headers"], drop=_REPLACED_REQUEST_HEADERS -
                                  {"accept-encoding"})
        parent = continued_parent(parent_traceparent_of(scope))   # the HTTP span, if any
        if parent is not None:
            headers.append(("traceparent", str(parent)))
        exchange = self.upstream.exchange(scope["method"], _raw_path(scope),
                                          scope.get("query_string", b""),
                                          [*headers, *_forwarded_for(scope)], body)
        await self._relay(exchange, scope, receive, send, None, list)

    async def _relay(self, exchange: UpstreamExchange, scope, receive, send,
                     active: ActiveRequest | None, ours: Callable[[], list[tuple[bytes, bytes]]],
                     timing: Callable[[], bytes] | None = None,
                     fmt: str | None = None) -> Relay | None:
        """Ask the upstream and relay its answer, letting it go as soon as the client does.
        Returns the relay, or None when no upstream response came (`exchange.failure`).

        The request leaves first: `ours` (the proxy's own response headers) are made while
        the upstream works, not before it has the request. The watcher starts before the
        send: a client gone while the request waits for a pool slot is not forwarded."""
        watcher = asyncio.ensure_future(_abort_on_disconnect(receive, exchange))
        own_headers = []
        try:
            try:
                await exchange.send()
                own_headers = ours()
                head = await exchange.response_head()
            except UpstreamFailure as failure:
                _mark_upstream(active, exchange, None)
                if not failure.is_client_gone:   # nobody would read an answer
                    response = ProxyError(failure.status, failure.message,
                                          code=failure.error_type, type_="upstream_error")
                    await response.response(dict((k.decode(), v.decode())
                                                 for k, v in own_headers or ours()))(
                        scope, receive, send)
                return None
            _mark_upstream(active, exchange, head)
            relay = Relay(exchange, head, active, clock_ns=self.clock_ns, timing=timing, fmt=fmt,
                          hold=write_batch_hold(scope))
            # In a task of its own: each upstream read then resumes the relay's few frames,
            # not the whole ASGI chain above it (server cycle, middlewares, endpoint, this),
            # once per event. A cancelled request cancels it, and waits for it to unwind.
            await asyncio.ensure_future(relay.run(send, own_headers))
            return relay
        finally:
            watcher.cancel()
            exchange.close()

    def _finish_relay(self, relay: Relay) -> None:
        active = relay.active
        active.attrs.update(relay.upstream_attrs())
        timings = relay.summary.timings
        if timings and relay.end_ns is not None:
            active.timeline.event("upstream_timings", relay.end_ns, **_timings_fields(timings))
        finish_reason, error_type = request_outcome(relay, None)
        num_prompt, num_cached, num_output = relay.token_counts()
        drafted, accepted = llamacpp.draft_of(timings)
        self._finish(active, inband=_inband_timing(relay), end_ns=relay.end_ns or self.clock_ns(),
                     finish_reason=finish_reason, error_type=error_type,
                     num_prompt_tokens=num_prompt, num_cached_tokens=num_cached,
                     num_output_tokens=num_output, num_draft_tokens=drafted,
                     num_draft_accepted=accepted)

    def _finish(self, active: ActiveRequest, *, inband=None, **finish_kwargs) -> None:
        if self.join is None:
            self.tracer.finish(active, **finish_kwargs)
        else:
            self.join.finish(active, inband=inband, **finish_kwargs)


def _timings_fields(timings: dict) -> dict:
    """The numbers of an upstream's `timings`, as the `upstream_timings` event's attributes:
    any key is a field (`Timeline.event` takes its own parameters positionally), the first
    `_MAX_TIMINGS_FIELDS` only.

    >>> _timings_fields({"prompt_ms": 1.5, "name": 2, "t_ns": "x"})
    {'prompt_ms': 1.5, 'name': 2}
    """
    numbers = ((str(k)[:64], v) for k, v in timings.items() if isinstance(v, (int, float)))
    return dict(itertools.islice(numbers, _MAX_TIMINGS_FIELDS))


def _inband_timing(relay: Relay):
    """The engine's timing carried by the response itself: llama.cpp's `timings` in the
    stream, vLLM's per-request `metrics`, Ollama's final line, TGI's headers on a whole
    answer; None when none came."""
    timings = relay.summary.timings
    if llamacpp.matches(timings):
        return llamacpp.timing_of(timings)
    if vllm_metrics.matches(relay.summary.metrics):
        return vllm_metrics.timing_of(relay.summary.metrics)
    if ollama.matches(relay.summary.ollama_final):
        return ollama.timing_of(relay.summary.ollama_final)
    if not relay.is_sse and tgi.matches(relay.head.headers):
        return tgi.timing_of(relay.head.headers)
    return None


def _mark_upstream(active: ActiveRequest | None, exchange: UpstreamExchange,
                   head: ResponseHead | None) -> None:
    """The upstream stages, named from the times the exchange reports: `upstream_connect`
    ends when the request went to a transport, `upstream_ttfb` when the head arrived."""
    if active is None:
        return
    timeline = active.timeline
    if exchange.connect_ns is not None:
        timeline.stage_attr("upstream_connect", "new_connection", True)
        timeline.stage_attr("upstream_connect", "connect_ms", exchange.connect_ns / 1e6)
    if exchange.handed_ns is not None:
        timeline.mark("upstream_connect", exchange.handed_ns)
    if head is not None:
        timeline.mark("upstream_ttfb", head.received_ns)


async def _abort_on_disconnect(receive, exchange: UpstreamExchange) -> None:
    """Let the upstream go when the client does, unless its response has already ended.

    The body has been read in full, so the next message can only be the disconnect. uvicorn
    also answers `http.disconnect` as soon as the response is complete (its `receive`, once
    `response_complete`), which wakes this watcher before the relay's task returns: aborting
    then reset every upstream connection after its response, and each request paid a new
    TCP connection (and the upstream an accept). An exchange whose response arrived whole
    keeps its connection for the next request, as nginx's upstream `keepalive` pool does
    (ngx_http_upstream_keepalive_module: a connection goes back to the cache once its
    response was read to its end); one cut short is still reset, so the upstream stops.
    """
    while (await receive())["type"] != "http.disconnect":
        pass
    if not exchange.at_end:
        exchange.abort()


def _raw_path(scope) -> str:
    # The path as the client sent it (percent-escapes untouched), not a re-encoded URL.
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if raw else scope["path"]


def _forwarded_for(scope) -> list[tuple[str, str]]:
    prior = header_value(scope, b"x-forwarded-for")
    prior = prior.decode("latin-1") if prior is not None else None
    # The TCP peer, also where --forwarded-allow-ips made scope["client"] the forwarded one.
    client = scope.get("state", {}).get(PEER_KEY) or scope.get("client")
    host = client[0] if client else None
    if host is None:
        return [("x-forwarded-for", prior)] if prior else []
    return [("x-forwarded-for", f"{prior}, {host}" if prior else host)]
