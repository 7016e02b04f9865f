"""A streamed completion: its SSE events as the engine produces them, each output timed once
its event was handed to the transport, and a response that finishes the request's record
however it ended (done, an engine failure, a reader too slow, the client gone).

The server's `send` stage ends with the first output's event: StreamingResponse resumes the
generator only after the ASGI send of the previous event has returned.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import anyio
from fastapi.responses import StreamingResponse

from instrumented_engine.engine.errors import SlowReaderError
from instrumented_engine.engine.request_stream import RequestStream
from instrumented_engine.server.progress import (
    ENGINE_FAILED,
    SLOW_READER_ABORTED,
    FinishRecord,
    Progress,
)
from instrumented_engine.server.sse import DONE, ChunkFormatter, error_event
from instrumented_engine.server.tool_call_output import tool_call_events
from instrumented_engine.server.tool_choice import ToolPlan
from tracer.core.request_tracer import ActiveRequest
from tracer.record.errors import ABORT, INTERNAL, SLOW_READER
from tracer.web.inband import InbandTimer

log = logging.getLogger(__name__)


def stream_response(active: ActiveRequest, stream: RequestStream, fmt: ChunkFormatter,
                    headers: dict, *, include_usage: bool, timing: InbandTimer | None,
                    plan: ToolPlan | None, clock_ns: Callable[[], int],
                    finish: FinishRecord) -> ReleasingStreamingResponse:
    """The streaming response of a request the engine admitted. `timing`: the signed timing
    line goes before `[DONE]` (the client asked for it); `plan`: the answer is tool calls."""
    progress = Progress([])
    response = ReleasingStreamingResponse(
        _events(active, stream, fmt, include_usage, progress, timing, plan, clock_ns, finish),
        on_close=lambda: _release(active, stream, progress, finish),
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def slow_reader() -> None:
        # The writer is stuck sending an earlier event (the transport is paused):
        # stop it, so the response ends and the record is finished now.
        progress.end("abort", SLOW_READER)
        response.cancel()
    stream.on_slow_reader = slow_reader
    return response


async def _events(active: ActiveRequest, stream: RequestStream, fmt: ChunkFormatter,
                  include_usage: bool, progress: Progress, timing: InbandTimer | None,
                  plan: ToolPlan | None, clock_ns: Callable[[], int],
                  finish: FinishRecord) -> AsyncIterator[bytes]:
    timeline = active.timeline
    # StreamingResponse sent the headers just before pulling the first chunk: the probe's
    # clock alignment pairs this with the browser's "headers received".
    timeline.event("response_start", clock_ns())
    calls = None if plan is None else plan.reader()
    try:
        async for out in stream:
            progress.num_output_tokens = out.num_output_tokens
            if calls is not None:
                for event in tool_call_events(calls, out, fmt, timeline, progress, clock_ns):
                    yield event
            elif out.text:
                yield fmt.content(out.text, first=not progress.sent_first)
                # Resumed: the ASGI send of that event has returned (handed to transport).
                now_ns = clock_ns()
                if not progress.sent_first:
                    timeline.mark("send", now_ns)
                    timeline.output("text", now_ns)
                    progress.sent_first = True
                timeline.emit(now_ns)
            if out.finished:
                progress.finish_reason = out.finish_reason
        reason = progress.finish_reason or "stop"
        yield fmt.finish(reason if plan is None else plan.finish_reason(reason),
                         first=not progress.sent_first)
        if include_usage:
            yield fmt.usage(stream.num_prompt_tokens, progress.num_output_tokens,
                            stream.num_cached_tokens)
        if timing is not None:
            # Opted in: the signed timing as an SSE comment, which clients skip
            # (tracer/web/inband.py); every content send is known by now.
            line = timing.line(active)
            if line:
                yield line
        yield DONE
    except SlowReaderError:  # the reader caught up after all, too late: say why it ended
        progress.end("abort", SLOW_READER)
        yield error_event(SLOW_READER_ABORTED, code=SLOW_READER)
    except Exception:  # noqa: BLE001 - the engine failed on this request: tell the client
        log.exception("streaming %s failed", active.request_id)
        progress.finish_reason, progress.error_type = "error", INTERNAL
        yield error_event(ENGINE_FAILED, code="internal_error")
    finally:
        # Reached on success, on engine failure, and on client disconnect (cancellation).
        progress.end("abort", ABORT)
        finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)


def _release(active: ActiveRequest, stream: RequestStream, progress: Progress,
             finish: FinishRecord) -> None:
    """After the streaming response, whatever happened: a response cancelled before its
    generator ever ran (the client left at once) still aborts and finishes the request."""
    if not progress.finished:
        stream.abort()
        progress.end("abort", ABORT)
        finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)


class ReleasingStreamingResponse(StreamingResponse):
    """A StreamingResponse that calls `on_close` when it is done, however it ended: a
    generator cancelled before its first step never runs its own `finally`."""

    def __init__(self, content, *, on_close: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close
        self._scope = anyio.CancelScope()

    def cancel(self) -> None:
        """End the response now, also while it waits in a send; from the event loop. The
        app then returns with the response unfinished, and uvicorn closes the connection."""
        self._scope.cancel()

    async def __call__(self, scope, receive, send) -> None:
        try:
            with self._scope:
                await super().__call__(scope, receive, send)
        finally:
            self._on_close()
