"""Relay one upstream response to the client through ASGI `send`, byte for byte, timing
what passes.

Every upstream read (all bytes that arrived since the last one) goes to the client as one
body message: no buffering, no re-framing; `SSEScanner` reads the same bytes on the side.
Proxy stage boundaries set here: `upstream_first_token` (the bytes completing the first
output event, of any kind, arrived from the upstream) and `send` (they were handed to the
client's transport); then each kind's first output and each tool call's start and ready, at
their hand-over (docs/architecture.md, "First output, by kind"). A stream that breaks ends
with one SSE error event; a client that goes away (the serving layer then aborts the
exchange) ends the relay at once.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from tracer.proxy.client_body import ClientBody
from tracer.proxy.formats import FormatScanner, summarize_format_body
from tracer.proxy.headers import relayed_headers
from tracer.proxy.http1 import ResponseHead
from tracer.proxy.inband_splice import DoneSplitter, TimingLineStripper
from tracer.proxy.ollama_stream import OllamaScanner, error_line, summarize_ollama_body
from tracer.proxy.relay_outcome import RelayStatus
from tracer.proxy.sse import SSEScanner
from tracer.proxy.stream_summary import (StreamSummary, summarize_body, token_counts,
                                         upstream_attributes)
from tracer.proxy.upstream import UpstreamExchange
from tracer.proxy.upstream_errors import UpstreamError, UpstreamTimeout
from tracer.record.errors import INVALID_REQUEST, UPSTREAM, UPSTREAM_STATUS
from tracer.record.tool_calls import READY, START
from tracer.web.openai_http import OpenAIError

_MAX_SUMMARY_BODY_BYTES = 4 << 20   # a non-streamed body larger than this is not inspected
_MAX_FINISH_REASON_CHARS = 32
_END = {"type": "http.response.body", "body": b"", "more_body": False}

Send = Callable[[dict], Awaitable[None]]


class Relay:
    """One upstream response on its way to the client, and what it said.

    `active` is the request's `ActiveRequest` (None for an untraced passthrough).

    Inside the endpoint's coroutine::

        relay = Relay(exchange, head, active)
        await relay.run(send, [(b"x-request-id", b"proxy-1")])
        relay.outcome        # e.g. ('stop', None)
    """

    def __init__(self, exchange: UpstreamExchange, head: ResponseHead, active, *,
                 clock_ns: Callable[[], int] = time.perf_counter_ns,
                 timing: Callable[[], bytes] | None = None, fmt: str | None = None,
                 hold: Callable[[], None] | None = None) -> None:
        self.exchange = exchange
        # The server's write batching (tracer/web/write_batch.py), None where it offers none:
        # the head leaves with the first body bytes when they are already here, and the last
        # bytes with the end of the body.
        self.hold = hold
        # The answer's stream format when the route is not OpenAI chat/completions
        # (tracer/proxy/formats.py): chosen once here, so no event pays for the choice.
        self.fmt = fmt
        # Builds the proxy's `: ttft-timing` line (tracer/web/inband.py) when the client
        # opted in; it goes right before the upstream's `data: [DONE]`.
        self.timing = timing
        self.head = head
        self.active = active
        self.clock_ns = clock_ns
        content_type = head.header(b"content-type") or b""
        self.is_sse = content_type.startswith(b"text/event-stream")
        # Ollama's native stream: NDJSON lines, relayed and timed as an SSE stream is.
        self.is_ndjson = fmt == "ollama" and content_type.startswith(b"application/x-ndjson")
        self.outcome: tuple[str, str | None] | None = None
        self.summary = StreamSummary()
        self.end_ns: int | None = None
        # The SSE relay's per-stream state (`_relay_sse`, `_scanned`).
        self._scanner = None
        self._timeline = None
        self._client_body: ClientBody | None = None
        self._first_sent = False   # the first output's bytes went out (its marks are set)
        self._text_sent = False    # the first text's did

    def client_headers(self, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return relayed_headers(self.head.headers, self.is_sse or self.is_ndjson, extra)

    async def run(self, send: Send, extra_headers: list[tuple[bytes, bytes]] = ()) -> None:
        """Relay the response; `outcome` says how it ended."""
        if self.hold is not None and self.exchange.has_body_bytes:
            self.hold()
        await send({"type": "http.response.start", "status": self.head.status,
                    "headers": self.client_headers(list(extra_headers))})
        if self.active is not None:
            # The browser's "headers received" pairs with this instant in the probe's
            # clock alignment.
            self.active.timeline.event("response_start", self.clock_ns())
        if self.is_sse or self.is_ndjson:
            await self._relay_sse(send)
        else:
            await self._relay_whole(send)

    async def _relay_sse(self, send: Send) -> None:
        # An Ollama route answered in SSE is not Ollama's NDJSON: the SSE default rule reads it.
        scanner = self._scanner = (OllamaScanner() if self.is_ndjson
                                   else SSEScanner() if self.fmt in (None, "ollama")
                                   else FormatScanner(self.fmt))
        self.summary = scanner.summary
        self._timeline = self.active.timeline if self.active is not None else None
        exchange, hold = self.exchange, self.hold
        # Answering the opt-in: the upstream's own timing lines go, ours goes before [DONE].
        splitter = None if self.timing is None else DoneSplitter()
        stripper = None if self.timing is None else TimingLineStripper()
        # The reads between the first and the last go to the client from the upstream
        # connection's own callback (`Http1Connection.push_body`, `_pushed`), where the
        # server lets the relay write its body itself (tracer/proxy/client_body.py); the
        # others, and every read of a rewritten stream, come here through `read`.
        body = self._client_body = None if splitter is not None else ClientBody.of(send)
        try:
            while True:
                if body is not None:
                    await exchange.push(self._pushed)
                chunk = await exchange.read()
                if not chunk:
                    break
                # The bytes go first, then they are read: the scan is off the token's path.
                # Its marks keep their instants: arrival (stamped as the bytes came) and
                # hand-over to the client's transport (stamped right after the send).
                arrived_ns = exchange.last_data_ns
                if hold is not None and exchange.at_end:
                    hold()   # the last bytes: they leave with what ends the body
                done_part = None
                if splitter is None:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                else:
                    now, done_part = splitter.feed(stripper.feed(chunk))
                    if now:
                        await send(_body(now))
                self._scanned(chunk, arrived_ns, self.clock_ns())
                if done_part is not None:
                    # Every content event before [DONE] has been sent and timed by now.
                    await send(_body(self.timing() + done_part))
        except UpstreamError as exc:
            if exchange.aborted:    # the client went away
                self._end(RelayStatus.ABORTED)
                return
            held = _held(splitter, stripper)
            if held:   # what the in-band rewrite held back was the upstream's, and is sent
                await send(_body(held))
            if scanner.summary.done:   # everything was delivered; only the close was unclean
                self._end(self._upstream_outcome())
                await send(_END)
            elif isinstance(exc, UpstreamTimeout):
                self._end(RelayStatus.TIMED_OUT)
                await send(_body(self._error(scanner.pending, "the upstream stopped sending "
                                             "(read timeout)", "upstream_timeout")))
                await send(_END)
            else:
                self._end(RelayStatus.CUT)
                await send(_body(self._error(scanner.pending, "the upstream stream broke "
                                             f"off ({exc})", "upstream_stream_cut")))
                await send(_END)
            return
        if splitter is not None and not splitter.found:
            # No [DONE] from this upstream: the line goes at the end, on a fresh line.
            tail = _held(splitter, stripper)
            if tail:
                await send(_body(tail))
            if not scanner.pending:
                await send(_body(self.timing()))
        summary = scanner.summary
        if self.active is not None and (exchange.overran or not (
                summary.done or summary.finish_reason or summary.error)):
            # A completion framed to an end the upstream did not mean: bytes came past its
            # Content-Length, or the stream closed before its end event, a finish reason or an
            # error event. (A passthrough stream is not a completion: it stays byte for byte.)
            self._end(RelayStatus.CUT)
            await send(_body(self._error(
                scanner.pending, "the upstream sent more than its declared Content-Length"
                if exchange.overran else "the upstream's stream ended before its end event",
                "upstream_stream_cut")))
            await send(_END)
            return
        self._end(self._upstream_outcome())
        await send(_END)

    def _pushed(self, chunk: bytes) -> bool:
        """One upstream read, handed over by the connection as it arrived: written to the
        client, then read. False, taking nothing, while the client's transport is full: the
        read is then `read` here and waits in `send` for the drain."""
        if not self._client_body.write(chunk):
            return False
        sent_ns = self.clock_ns()
        scanner = self._scanner
        num_content = scanner.feed(chunk)
        if num_content == 1 and self._text_sent and not scanner.moments:
            self._timeline.emit(sent_ns)   # the common read after the first text
        elif num_content or scanner.moments:
            self._time(num_content, self.exchange.last_data_ns, sent_ns)
        return True

    def _scanned(self, chunk: bytes, arrived_ns: int, sent_ns: int) -> None:
        """Read what was relayed, and time what it completed: `arrived_ns` when its bytes
        came from the upstream, `sent_ns` when they were handed to the client's transport."""
        scanner = self._scanner
        num_content = scanner.feed(chunk)
        if num_content == 1 and self._text_sent and not scanner.moments:
            # The common read after the first text: one more emit, nothing else.
            self._timeline.emit(sent_ns)
        elif num_content or scanner.moments:
            self._time(num_content, arrived_ns, sent_ns)

    def _time(self, num_content: int, arrived_ns: int, sent_ns: int) -> None:
        """The marks of a read that completed `num_content` content events or moments."""
        moments = self._scanner.take_moments()
        timeline = self._timeline
        if timeline is None:
            return
        if not self._first_sent:
            timeline.mark("upstream_first_token", arrived_ns)
            timeline.mark("send", sent_ns)
            self._first_sent = True
        if moments:
            _time_moments(timeline, moments, sent_ns)
        if num_content and not self._text_sent:
            timeline.output("text", sent_ns)
            self._text_sent = True
        for _ in range(num_content):
            timeline.emit(sent_ns)

    async def _relay_whole(self, send: Send) -> None:
        """A non-SSE body (JSON answer, error, passthrough): relayed as it arrives; its
        content is known once complete, so TTFT ends with its last chunk. A body that
        breaks off is not completed: the client connection closes, which is how HTTP/1.1
        says "truncated"."""
        parts, size, received_ns, sent_ns = [], 0, None, None
        keep = self.active is not None   # only a traced answer is read for its content
        try:
            while chunk := await self.exchange.read():
                received_ns = self.exchange.last_data_ns
                if keep and size + len(chunk) <= _MAX_SUMMARY_BODY_BYTES:
                    parts.append(chunk)
                size += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent_ns = self.clock_ns()
        except UpstreamError as exc:
            self._end(RelayStatus.ABORTED if self.exchange.aborted else
                      RelayStatus.TIMED_OUT if isinstance(exc, UpstreamTimeout) else
                      RelayStatus.CUT)
            return
        if keep and size <= _MAX_SUMMARY_BODY_BYTES:
            self._summarize_whole(b"".join(parts), received_ns, sent_ns)
        # Bytes past the declared Content-Length: the client got a body the upstream did not
        # mean to end there (its framing is complete, so the trace is what can say so).
        self._end(RelayStatus.CUT if self.exchange.overran else self._upstream_outcome())
        await send(_END)

    def _summarize_whole(self, body: bytes, received_ns: int | None, sent_ns: int | None) -> None:
        if (self.head.header(b"content-encoding") or b"identity") != b"identity":
            return
        self.summary, has_content, calls = (
            summarize_body(body) if self.fmt is None else summarize_ollama_body(body)
            if self.fmt == "ollama" else summarize_format_body(body, self.fmt))
        if (has_content or calls) and received_ns is not None and sent_ns is not None:
            timeline = self.active.timeline
            timeline.mark("upstream_first_token", received_ns)
            timeline.mark("send", sent_ns)
            if calls:
                timeline.output("tool_call", sent_ns)
                _time_moments(timeline, calls, sent_ns)
            if has_content:
                timeline.output("text", sent_ns)
                timeline.emit(sent_ns)

    def _error(self, pending: bool, message: str, code: str) -> bytes:
        """The proxy's own end of a broken stream, in the stream's framing."""
        return error_line(pending, message) if self.is_ndjson else _error_event(pending, message,
                                                                                code)

    def _upstream_outcome(self) -> tuple[str, str | None]:
        status = self.head.status
        if status >= 500:
            return "error", UPSTREAM_STATUS
        if status >= 400:
            return "error", INVALID_REQUEST
        if self.summary.error is not None:   # an in-band error event from the upstream
            return "error", UPSTREAM
        reason = self.summary.finish_reason or "stop"
        return reason[:_MAX_FINISH_REASON_CHARS], None

    def _end(self, outcome: tuple[str, str | None]) -> None:
        self.outcome = outcome
        self.end_ns = self.clock_ns()

    def final_outcome(self) -> tuple[str, str | None]:
        """How the request ended, also when the relay never got to say (the client left
        first, or the task was cancelled)."""
        if self.outcome is not None and self.outcome != RelayStatus.ABORTED:
            return self.outcome
        if self.summary.done:
            # The client left after `[DONE]` (SDKs close right then): it got everything.
            return self._upstream_outcome()
        return RelayStatus.ABORTED

    def upstream_attrs(self) -> dict:
        """What the upstream said about itself, for the request span."""
        return upstream_attributes(self.head, self.summary)

    def token_counts(self) -> tuple[int, int, int]:
        return token_counts(self.summary)


def _held(splitter: DoneSplitter | None, stripper: TimingLineStripper | None) -> bytes:
    """The bytes the in-band rewrite still holds back, once the stream has ended."""
    if splitter is None:
        return b""
    return splitter.feed(stripper.flush())[0] + splitter.flush()


def _body(data: bytes) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": True}


def _error_event(pending: bool, message: str, code: str) -> bytes:
    return OpenAIError(502, message, code=code, type_="upstream_error").sse_event(
        after_partial_event=pending)


def _time_moments(timeline, moments, t_ns: int) -> None:
    """A scanner's moments (tracer/proxy/sse.py, `moments`) at the hand-over instant."""
    for what, key, value in moments:
        if what == "output":
            timeline.output(key, t_ns)
        elif what == START:
            timeline.tool_call(key, t_ns, value)
        elif what == READY:
            timeline.tool_call_ready(key, t_ns)
