"""The OpenAI endpoints' request flow: validate → trace → admit → stream, stage by stage.

The server owns two of the nine stages: `receive` (ASGI entry → body parsed and validated)
and `send` (first text exists → its SSE event handed to the transport). The engine marks
the seven in between through the injected recorder.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from instrumented_engine.engine.async_engine import AsyncEngine, RequestStream
from instrumented_engine.server.protocol import (ChatCompletionRequest, CompletionRequest,
                                                 OpenAIError, parse_request)
from instrumented_engine.server.recording import TimelineRecorder
from instrumented_engine.server.sse import DONE, ChunkFormatter, error_event, usage_dict
from tracer.web.observability import RECEIVE_START_KEY
from tracer.core.request_tracer import ActiveRequest, Tracer
from tracer.web.openai_http import parent_traceparent, read_body


@dataclasses.dataclass(slots=True)
class _Progress:
    """What a response has produced so far; becomes the request's record at the end."""
    text_parts: list[str]
    num_output_tokens: int = 0
    finish_reason: str | None = None
    error_type: str | None = None
    sent_first: bool = False


class OpenAIServing:
    """Serves /v1/chat/completions and /v1/completions on an AsyncEngine, traced. Built by
    `instrumented_engine.server.app.create_app`; a route calls, in the request's task::

        response = await serving.handle(request, chat=True)
    """

    def __init__(self, aengine: AsyncEngine, tracer: Tracer, recorder: TimelineRecorder, *,
                 max_body_bytes: int, clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self.aengine = aengine
        self.tracer = tracer
        self.recorder = recorder
        self.model_name = aengine.engine.model_name
        self.max_body_bytes = max_body_bytes
        self.clock_ns = clock_ns

    async def handle(self, request: Request, *, chat: bool) -> JSONResponse | StreamingResponse:
        start_ns = request.scope.get("state", {}).get(RECEIVE_START_KEY) or self.clock_ns()
        body = await read_body(request, self.max_body_bytes)
        req = parse_request(body, ChatCompletionRequest if chat else CompletionRequest)
        if req.model != self.model_name:
            raise OpenAIError(404, f"The model `{req.model[:200]}` does not exist; this server "
                                f"serves `{self.model_name}`.", param="model",
                                code="model_not_found")
        sampling = req.sampling_params(max_tokens_default=1)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        active = self.tracer.begin(
            request_id=request_id, model=self.model_name,
            operation="chat" if chat else "text_completion",
            traceparent=parent_traceparent(request), start_ns=start_ns,
            attrs={"gen_ai.request.max_tokens": req.max_tokens,
                   "gen_ai.request.temperature": sampling.temperature,
                   "gen_ai.request.top_p": sampling.top_p, "stream": req.stream})
        active.timeline.mark("receive", self.clock_ns())
        self.recorder.attach(request_id, active.timeline)
        try:
            stream = await self.aengine.submit(
                request_id, sampling=sampling, fill_max_tokens=req.max_tokens is None,
                messages=req.template_messages() if chat else None,
                prompt=None if chat else req.prompt_text())
        except ValueError as exc:  # template, length and sampling errors: the client's fault
            self._finish(active, _Progress([], finish_reason="error",
                                           error_type="invalid_request"), 0, 0)
            raise OpenAIError(400, str(exc), param=getattr(exc, "param", None),
                                code=getattr(exc, "code", None)) from exc
        headers = {"Server-Timing": active.server_timing, "X-Request-Id": request_id}
        fmt = ChunkFormatter(request_id, self.model_name, int(time.time()), chat=chat)
        if req.stream:
            return StreamingResponse(
                self._stream(active, stream, fmt, req.include_usage),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await self._collect(active, stream, chat), headers=headers)

    async def _stream(self, active: ActiveRequest, stream: RequestStream, fmt: ChunkFormatter,
                      include_usage: bool) -> AsyncIterator[bytes]:
        progress = _Progress([])
        timeline = active.timeline
        # StreamingResponse sent the headers just before pulling the first chunk: the probe's
        # clock alignment pairs this with the browser's "headers received".
        timeline.event("response_start", self.clock_ns())
        try:
            async for out in stream:
                progress.num_output_tokens = out.num_output_tokens
                if out.text:
                    yield fmt.content(out.text, first=not progress.sent_first)
                    # Resumed: the ASGI send of that event has returned (handed to transport).
                    now_ns = self.clock_ns()
                    if not progress.sent_first:
                        timeline.mark("send", now_ns)
                        progress.sent_first = True
                    timeline.emit(now_ns)
                if out.finished:
                    progress.finish_reason = out.finish_reason
            yield fmt.finish(progress.finish_reason or "stop", first=not progress.sent_first)
            if include_usage:
                yield fmt.usage(stream.num_prompt_tokens, progress.num_output_tokens,
                                stream.num_cached_tokens)
            yield DONE
        except RuntimeError as exc:  # the engine step failed: tell the client, then end
            progress.finish_reason, progress.error_type = "error", "engine_error"
            yield error_event(str(exc))
        finally:
            # Reached on success, on engine failure, and on client disconnect (cancellation).
            if progress.finish_reason is None:
                progress.finish_reason, progress.error_type = "abort", "client_disconnect"
            self._finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)

    async def _collect(self, active: ActiveRequest, stream: RequestStream, chat: bool) -> dict:
        progress = _Progress([])
        try:
            async for out in stream:
                progress.text_parts.append(out.text)
                progress.num_output_tokens = out.num_output_tokens
                if out.finished:
                    progress.finish_reason = out.finish_reason
        finally:
            if progress.finish_reason is None:
                progress.finish_reason, progress.error_type = "abort", "client_disconnect"
            # Nothing is sent before the whole body: TTFT here is the first text being ready.
            first_text_ns = active.timeline.mark_ns("detokenize")
            if first_text_ns is not None:
                active.timeline.mark("send", first_text_ns)
            self._finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)
        text = "".join(progress.text_parts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                  if chat else {"index": 0, "text": text})
        choice.update(logprobs=None, finish_reason=progress.finish_reason)
        return {"id": active.request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name, "choices": [choice],
                "usage": usage_dict(stream.num_prompt_tokens, progress.num_output_tokens,
                                    stream.num_cached_tokens)}

    def _finish(self, active: ActiveRequest, progress: _Progress, num_prompt_tokens: int,
                num_cached_tokens: int) -> None:
        self.recorder.detach(active.request_id)
        self.tracer.finish(active, end_ns=self.clock_ns(),
                           finish_reason=progress.finish_reason or "stop",
                           error_type=progress.error_type, num_prompt_tokens=num_prompt_tokens,
                           num_cached_tokens=num_cached_tokens,
                           num_output_tokens=progress.num_output_tokens)
