"""Relay one upstream response to the client, byte for byte, timing what passes.

Every upstream chunk is handed to the client transport as it arrives (no buffering, no
re-framing); `SSEScanner` reads the same bytes on the side. Proxy stage boundaries set here:
`upstream_first_token` (the upstream chunk completing the first content event arrived) and
`send` (that chunk handed to the client transport). A stream that breaks ends with one SSE
error event; a client that goes away closes the upstream response, which closes its
connection, so the upstream sees the cancellation.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
from starlette.responses import StreamingResponse

from tracer.proxy_sse import SSEScanner, StreamSummary, summarize_body, token_counts
from tracer.proxy_upstream import response_headers
from tracer.traceparent import parse_server_timing

# Headers the proxy answers with itself: its own trace context, request id, date and server.
_REPLACED = frozenset(("server-timing", "x-request-id", "date", "server"))
_MAX_SUMMARY_BODY_BYTES = 4 << 20   # a non-streamed body larger than this is not inspected
_MAX_FINISH_REASON_CHARS = 32


class RelayStatus:
    """Why a relay ended: (finish_reason, error_type) pairs.

    >>> RelayStatus.CUT
    ('error', 'upstream')
    """

    ABORTED = ("abort", "abort")
    CUT = ("error", "upstream")
    TIMED_OUT = ("error", "timeout")


class Relay:
    """One upstream response on its way to the client, and the request's trace.

    `active` is the request's `ActiveRequest` (None for an untraced passthrough);
    `on_finish(relay, finish_reason, error_type, end_ns)` is called once, whatever happens.

    >>> relay = Relay(response, active, on_finish)   # doctest: +SKIP
    >>> RelayResponse(relay, [(b"x-request-id", b"proxy-1")])   # doctest: +SKIP
    """

    def __init__(self, response: httpx.Response, active, on_finish: Callable, *,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self.response = response
        self.active = active
        self.on_finish = on_finish
        self.clock_ns = clock_ns
        self.is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        self.outcome: tuple[str, str | None] | None = None
        self.summary = StreamSummary()
        self.end_ns: int | None = None
        self._chunks = None
        self._closed = False

    def client_headers(self) -> list[tuple[bytes, bytes]]:
        drop = _REPLACED | {"content-length"} if self.is_sse else _REPLACED
        return response_headers(self.response.headers, drop=drop)

    def iterate(self) -> AsyncIterator[bytes]:
        """The body for the client (a generator: nothing runs before the first pull)."""
        return self._stream() if self.is_sse else self._whole()

    def _upstream_chunks(self) -> AsyncIterator[bytes]:
        # Kept so close() can finish it: left suspended, the GC would close it later in a
        # task of its own.
        self._chunks = self.response.aiter_raw()
        if self.active is not None:
            # The client's headers went out just before this first pull: the probe's clock
            # alignment pairs this instant with the browser's "headers received".
            self.active.timeline.event("response_start", self.clock_ns())
        return self._chunks

    async def _stream(self) -> AsyncIterator[bytes]:
        scanner = SSEScanner()
        self.summary = scanner.summary
        timeline = self.active.timeline if self.active is not None else None
        first_sent = False
        try:
            async for chunk in self._upstream_chunks():
                received_ns = self.clock_ns()
                num_content = scanner.feed(chunk)
                if num_content and not first_sent and timeline is not None:
                    timeline.mark("upstream_first_token", received_ns)
                yield chunk
                if num_content and timeline is not None:
                    sent_ns = self.clock_ns()   # resumed: the ASGI send of `chunk` returned
                    if not first_sent:
                        timeline.mark("send", sent_ns)
                    for _ in range(num_content):
                        timeline.emit(sent_ns)
                first_sent = first_sent or num_content > 0
            self._end(self._upstream_outcome())
        except httpx.TimeoutException:
            self._end(RelayStatus.TIMED_OUT)
            yield _error_event(scanner.pending, "the upstream stopped sending (read timeout)",
                               "upstream_timeout")
        except httpx.TransportError as exc:
            if scanner.summary.done:   # everything was delivered; only the close was unclean
                self._end(self._upstream_outcome())
                return
            self._end(RelayStatus.CUT)
            yield _error_event(scanner.pending, f"the upstream stream broke off "
                               f"({type(exc).__name__})", "upstream_stream_cut")

    async def _whole(self) -> AsyncIterator[bytes]:
        """A non-SSE body (JSON answer, error, passthrough): relayed as it arrives; its
        content is known once complete, so TTFT ends with its last chunk."""
        parts, size, received_ns, sent_ns = [], 0, None, None
        keep = self.active is not None   # only a traced answer is read for its content
        try:
            async for chunk in self._upstream_chunks():
                received_ns = self.clock_ns()
                if keep and size + len(chunk) <= _MAX_SUMMARY_BODY_BYTES:
                    parts.append(chunk)
                size += len(chunk)
                yield chunk
                sent_ns = self.clock_ns()
        except httpx.TimeoutException:
            self._end(RelayStatus.TIMED_OUT)
            return
        except httpx.TransportError:
            self._end(RelayStatus.CUT)
            return
        if keep and size <= _MAX_SUMMARY_BODY_BYTES:
            self._summarize_whole(b"".join(parts), received_ns, sent_ns)
        self._end(self._upstream_outcome())

    def _summarize_whole(self, body: bytes, received_ns: int | None, sent_ns: int | None) -> None:
        if self.response.headers.get("content-encoding", "identity") != "identity":
            return
        self.summary, has_content = summarize_body(body)
        if has_content and received_ns is not None and sent_ns is not None:
            timeline = self.active.timeline
            timeline.mark("upstream_first_token", received_ns)
            timeline.mark("send", sent_ns)
            timeline.emit(sent_ns)

    def _upstream_outcome(self) -> tuple[str, str | None]:
        status = self.response.status_code
        if status >= 500:
            return "error", "upstream_status"
        if status >= 400:
            return "error", "invalid_request"
        if self.summary.error is not None:   # an in-band error event from the upstream
            return "error", "upstream"
        reason = self.summary.finish_reason or "stop"
        return reason[:_MAX_FINISH_REASON_CHARS], None

    def _end(self, outcome: tuple[str, str | None]) -> None:
        self.outcome = outcome
        self.end_ns = self.clock_ns()

    async def close(self) -> None:
        """Close the upstream response (its connection, when unfinished) and finish the
        trace; idempotent, and safe inside a cancelled task."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if self._chunks is not None:
                await self._chunks.aclose()
            await self.response.aclose()
        if self.outcome is None and self.summary.done:
            # The client left after `[DONE]` (SDKs close right then): it got everything.
            self.outcome = self._upstream_outcome()
        finish_reason, error_type = self.outcome or RelayStatus.ABORTED
        self.on_finish(self, finish_reason, error_type, self.end_ns or self.clock_ns())

    def upstream_attrs(self) -> dict:
        """What the upstream said about itself, for the request span."""
        headers = self.response.headers
        attrs = {"llm.upstream.status_code": self.response.status_code}
        if headers.get("x-request-id"):
            attrs["llm.upstream.request_id"] = headers["x-request-id"][:128]
        upstream_parent = parse_server_timing(headers.get("server-timing"))
        if upstream_parent:
            attrs["llm.upstream.traceparent"] = upstream_parent
        for key, value in (self.summary.timings or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attrs[f"llm.upstream.timings.{str(key)[:64]}"] = value
        return attrs

    def token_counts(self) -> tuple[int, int, int]:
        return token_counts(self.summary)


def _error_event(pending: bool, message: str, code: str) -> bytes:
    # A partial event already went out: a blank line ends it so the error is its own event.
    event = ("data: " + json.dumps({"error": {"message": message, "type": "upstream_error",
                                              "param": None, "code": code}}) + "\n\n").encode()
    return b"\n\n" + event if pending else event


class RelayResponse(StreamingResponse):
    """A StreamingResponse that always closes its relay, even when the client leaves before
    the first chunk is pulled (the body generator never runs then).

    >>> return RelayResponse(Relay(response, active, on_finish))   # doctest: +SKIP
    """

    def __init__(self, relay: Relay, extra_headers: list[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(relay.iterate(), status_code=relay.response.status_code)
        self.raw_headers = [*relay.client_headers(), *extra_headers]
        self.relay = relay

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self.relay.close()
