"""The OpenAI endpoints' request flow: validate → trace → admit → stream, stage by stage.

The server owns two of the nine stages: `receive` (ASGI entry → body parsed and validated)
and `send` (first output exists → its SSE event handed to the transport). The engine marks
the seven in between through the injected recorder. The first output is the first text, or
for a tool call (tool_choice "required" or a named function) its first `tool_calls` delta,
the one that names the function; a streamed "required" call is named only a few tokens
after the first text, so the server ends `detokenize` there itself (recording.py).

Every way a traced request can end (done, bad input, engine failure, client gone, a bug)
finishes its record exactly once, with an `error_type` from `tracer.record.errors`:
`invalid_request`, `internal`, `abort`, or `slow_reader` for a stream whose reader fell too
far behind (docs/architecture.md, "Closed label vocabulary").
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.engine.errors import SlowReaderError
from instrumented_engine.engine.outputs import RequestOutput
from instrumented_engine.engine.request_stream import RequestStream
from instrumented_engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    parse_request,
)
from instrumented_engine.server.recording import TimelineRecorder
from instrumented_engine.server.sse import DONE, ChunkFormatter, error_event, usage_dict
from instrumented_engine.server.tool_choice import ToolPlan
from tracer.core.request_tracer import ActiveRequest, Tracer
from tracer.record.errors import ABORT, INTERNAL, INVALID_REQUEST, SLOW_READER
from tracer.record.ids import new_request_id
from tracer.record.prompt_overlap import MAX_PROMPT_SOURCE_BYTES
from tracer.web.inband import InbandTimer, wants_timing
from tracer.web.observability import RECEIVE_START_KEY
from tracer.web.openai_http import CLIENT_CLOSED_REQUEST, parent_traceparent, read_body

log = logging.getLogger(__name__)

# What a client is told when the engine fails on its request; the details go to the log.
ENGINE_FAILED = "The engine failed while generating this completion; please retry."
SLOW_READER_ABORTED = ("The stream was aborted: the client stopped reading it "
                       "(docs/architecture.md, \"Through the engine\").")


@dataclasses.dataclass(slots=True)
class _Progress:
    """What a response has produced so far; becomes the request's record at the end."""
    text_parts: list[str]
    num_output_tokens: int = 0
    finish_reason: str | None = None
    error_type: str | None = None
    sent_first: bool = False
    finished: bool = False  # the record was handed to the tracer

    def end(self, finish_reason: str, error_type: str | None) -> None:
        """Set how the request ended, unless that is already known."""
        if self.finish_reason is None:
            self.finish_reason, self.error_type = finish_reason, error_type


class OpenAIServing:
    """Serves /v1/chat/completions and /v1/completions on an AsyncEngine, traced. Built by
    `instrumented_engine.server.app.create_app`; a route calls, in the request's task::

        response = await serving.handle(request, chat=True)
    """

    def __init__(self, aengine: AsyncEngine, tracer: Tracer, recorder: TimelineRecorder, *,
                 max_body_bytes: int, clock_ns: Callable[[], int] = time.perf_counter_ns,
                 inband: InbandTimer | None = None) -> None:
        self.aengine = aengine
        # Builds the `: ttft-timing` line for requests that send `X-TTFT-Timing: 1`.
        self.inband = inband
        self.tracer = tracer
        self.recorder = recorder
        self.model_name = aengine.engine.model_name
        self.max_body_bytes = max_body_bytes
        self.clock_ns = clock_ns

    async def handle(self, request: Request, *, chat: bool) -> Response:
        start_ns = request.scope.get("state", {}).get(RECEIVE_START_KEY) or self.clock_ns()
        body = await read_body(request, self.max_body_bytes)
        req = parse_request(body, ChatCompletionRequest if chat else CompletionRequest)
        if req.model != self.model_name:
            raise OpenAIError(404, f"The model `{req.model[:200]}` does not exist; this server "
                                f"serves `{self.model_name}`.", param="model",
                                code="model_not_found")
        sampling = req.sampling_params(max_tokens_default=1)
        plan = req.tool_plan() if chat else None
        if plan is not None:   # the answer is tool calls: decoding follows their schema
            sampling = dataclasses.replace(sampling, json_schema=plan.json_schema)
        if self.aengine.warming_up:
            # Refused before tracing: no record, no TTFT for a request nobody served.
            return OpenAIError(503, "The engine is warming up; retry when /health answers "
                               "200.", code="engine_warming_up",
                               type_="server_error").response(headers={"Retry-After": "1"})
        request_id = new_request_id("chatcmpl" if chat else "cmpl")
        active = self.tracer.begin(
            request_id=request_id, model=self.model_name,
            operation="chat" if chat else "text_completion",
            traceparent=parent_traceparent(request), start_ns=start_ns,
            attrs={"gen_ai.request.temperature": sampling.temperature,
                   "gen_ai.request.top_p": sampling.top_p, "stream": req.stream})
        active.timeline.mark("receive", self.clock_ns())
        messages = req.template_messages() if chat else None
        prompt = None if chat else req.prompt_text()
        if len(body) <= MAX_PROMPT_SOURCE_BYTES:
            # By reference, for the TTFT diagnosis' prompt overlap (off this thread).
            active.prompt_source = messages if chat else prompt
        self.recorder.attach(request_id, active.timeline, server_ends_detokenize=bool(
            plan is not None and plan.required and req.stream))
        try:
            stream = await self.aengine.submit(
                request_id, sampling=sampling, fill_max_tokens=req.max_tokens is None,
                messages=messages, prompt=prompt)
        except ValueError as exc:  # template, length, sampling, schema: the client's fault
            self._finish(active, _Progress([], finish_reason="error",
                                           error_type=INVALID_REQUEST), 0, 0)
            param = getattr(exc, "param", None)
            raise OpenAIError(400, str(exc), param="tools" if param == "json_schema" else param,
                                code=getattr(exc, "code", None)) from exc
        except Exception as exc:  # noqa: BLE001 - ours, not the client's: log, answer 500
            log.exception("admitting %s failed", request_id)
            self._finish(active, _Progress([], finish_reason="error", error_type=INTERNAL), 0, 0)
            raise OpenAIError(500, ENGINE_FAILED, code="internal_error",
                              type_="server_error") from exc
        except BaseException:  # cancelled: the server is shutting down mid-admission
            self._finish(active, _Progress([], finish_reason="abort", error_type=ABORT), 0, 0)
            raise
        # Recorded only once the engine accepted it (a 1e23 made every batch unexportable).
        active.attrs["gen_ai.request.max_tokens"] = req.max_tokens
        headers = {"Server-Timing": active.server_timing, "X-Request-Id": request_id}
        fmt = ChunkFormatter(request_id, self.model_name, int(time.time()), chat=chat)
        if req.stream:
            progress = _Progress([])
            timing = self.inband if wants_timing(request.scope) else None
            response = _ReleasingStreamingResponse(
                self._stream(active, stream, fmt, req.include_usage, progress, timing, plan),
                on_close=lambda: self._release(active, stream, progress),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

            def slow_reader() -> None:
                # The writer is stuck sending an earlier event (the transport is paused):
                # stop it, so the response ends and the record is finished now.
                progress.end("abort", SLOW_READER)
                response.cancel()
            stream.on_slow_reader = slow_reader
            return response
        return await self._collect(request, active, stream, chat, headers, plan)

    async def _stream(self, active: ActiveRequest, stream: RequestStream, fmt: ChunkFormatter,
                      include_usage: bool, progress: _Progress,
                      timing: InbandTimer | None = None,
                      plan: ToolPlan | None = None) -> AsyncIterator[bytes]:
        timeline = active.timeline
        # StreamingResponse sent the headers just before pulling the first chunk: the probe's
        # clock alignment pairs this with the browser's "headers received".
        timeline.event("response_start", self.clock_ns())
        calls = None if plan is None else plan.reader()
        try:
            async for out in stream:
                progress.num_output_tokens = out.num_output_tokens
                if calls is not None:
                    for event in self._tool_call_events(calls, out, fmt, timeline, progress):
                        yield event
                elif out.text:
                    yield fmt.content(out.text, first=not progress.sent_first)
                    # Resumed: the ASGI send of that event has returned (handed to transport).
                    now_ns = self.clock_ns()
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
            self._finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)

    def _tool_call_events(self, calls, out: RequestOutput, fmt: ChunkFormatter, timeline,
                          progress: _Progress) -> Iterator[bytes]:
        """The `tool_calls` deltas of one output, each timed once it was handed to the
        transport (this generator resumes after the send): a call starts with the delta
        that names it, and is ready with the one that completes its arguments. Never an
        `emit`: inter-token latency is about text."""
        for delta in calls.feed(out.text):
            first = not progress.sent_first
            if first:
                # A "required" call's first output comes after its first text; the engine
                # left `detokenize` open for this (recording.py): it ends now, when it exists.
                timeline.mark("detokenize", self.clock_ns())
                timeline.stage_attr("detokenize", "num_tokens", out.num_output_tokens)
            yield fmt.tool_call(delta.index, delta.arguments, first=first,
                                call_id=delta.call_id, name=delta.name)
            now_ns = self.clock_ns()
            if first:
                timeline.mark("send", now_ns)
                progress.sent_first = True
            if delta.name is not None:
                timeline.output("tool_call", now_ns)
                timeline.tool_call(delta.index, now_ns, name=delta.name)
            if delta.ready:
                timeline.tool_call_ready(delta.index, now_ns)

    def _release(self, active: ActiveRequest, stream: RequestStream, progress: _Progress) -> None:
        """After the streaming response, whatever happened: a response cancelled before its
        generator ever ran (the client left at once) still aborts and finishes the request."""
        if not progress.finished:
            stream.abort()
            progress.end("abort", ABORT)
            self._finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)

    async def _collect(self, request: Request, active: ActiveRequest, stream: RequestStream,
                       chat: bool, headers: dict, plan: ToolPlan | None = None) -> Response:
        progress = _Progress([])
        # The body is read, so the next ASGI message is the client leaving: watch for it
        # while the engine works, and stop generating for nobody (streaming gets the same
        # from StreamingResponse).
        drain = asyncio.ensure_future(_drain(stream, progress))
        gone = asyncio.ensure_future(_client_gone(request))
        failure: BaseException | None = None
        try:
            await asyncio.wait((drain, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            drain.cancel()  # a no-op once it is done; otherwise aborts the request now
            try:
                await drain
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 - the engine failed on this request
                failure = exc
                log.error("generating %s failed", active.request_id, exc_info=exc)
                progress.end("error", INTERNAL)
            progress.end("abort", ABORT)
            # Nothing is sent before the whole body: TTFT here is the first text being ready,
            # and of a tool call too (its calls are all handed over with the body).
            first_text_ns = active.timeline.mark_ns("detokenize")
            if first_text_ns is not None:
                active.timeline.mark("send", first_text_ns)
                active.timeline.output("text" if plan is None else "tool_call", first_text_ns)
            calls = None
            if plan is not None:
                reader = plan.reader()
                reader.feed("".join(progress.text_parts))
                calls = reader.calls
            if calls and first_text_ns is not None:
                now_ns = self.clock_ns()
                for i, call in enumerate(calls):
                    active.timeline.tool_call(i, first_text_ns, name=call.name)
                    if call.ready:
                        active.timeline.tool_call_ready(i, now_ns)
            self._finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)
        if failure is not None:
            return OpenAIError(500, ENGINE_FAILED, code="internal_error",
                               type_="server_error").response(headers=headers)
        if progress.error_type == ABORT:
            return OpenAIError(CLIENT_CLOSED_REQUEST, "The client closed the request.",
                               code="client_closed_request").response(headers=headers)
        text = "".join(progress.text_parts)
        if calls is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": c.call_id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}
            choice = {"index": 0, "message": message}
        else:
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                      if chat else {"index": 0, "text": text})
        choice.update(logprobs=None, finish_reason=progress.finish_reason if plan is None
                      else plan.finish_reason(progress.finish_reason))
        return JSONResponse({"id": active.request_id,
                             "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": self.model_name,
                             "choices": [choice],
                             "usage": usage_dict(stream.num_prompt_tokens,
                                                 progress.num_output_tokens,
                                                 stream.num_cached_tokens)}, headers=headers)

    def _finish(self, active: ActiveRequest, progress: _Progress, num_prompt_tokens: int,
                num_cached_tokens: int) -> None:
        if progress.finished:
            return
        progress.finished = True
        active.block_source = self.recorder.detach(active.request_id)
        self.tracer.finish(active, end_ns=self.clock_ns(),
                           finish_reason=progress.finish_reason or "stop",
                           error_type=progress.error_type, num_prompt_tokens=num_prompt_tokens,
                           num_cached_tokens=num_cached_tokens,
                           num_output_tokens=progress.num_output_tokens)


async def _drain(stream: RequestStream, progress: _Progress) -> None:
    async for out in stream:
        progress.text_parts.append(out.text)
        progress.num_output_tokens = out.num_output_tokens
        if out.finished:
            progress.finish_reason = out.finish_reason


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _ReleasingStreamingResponse(StreamingResponse):
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
