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

Here: a request parsed, checked, traced and admitted; its answer is streamed
(`stream_response.py`) or sent whole (`collect_response.py`), and both hand the record back
here to finish (`OpenAIServing._finish`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import Response

from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.server.collect_response import collect_response
from instrumented_engine.server.progress import ENGINE_FAILED, Progress
from instrumented_engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    parse_request,
)
from instrumented_engine.server.recording import TimelineRecorder
from instrumented_engine.server.sse import ChunkFormatter
from instrumented_engine.server.stream_response import stream_response
from tracer.core.request_tracer import ActiveRequest, Tracer
from tracer.record.errors import ABORT, INTERNAL, INVALID_REQUEST
from tracer.record.ids import new_request_id
from tracer.record.prompt_overlap import MAX_PROMPT_SOURCE_BYTES
from tracer.web.inband import InbandTimer, wants_timing
from tracer.web.observability import RECEIVE_START_KEY
from tracer.web.openai_http import parent_traceparent, read_body

log = logging.getLogger(__name__)


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
            self._finish(active, Progress([], finish_reason="error",
                                          error_type=INVALID_REQUEST), 0, 0)
            param = getattr(exc, "param", None)
            raise OpenAIError(400, str(exc), param="tools" if param == "json_schema" else param,
                                code=getattr(exc, "code", None)) from exc
        except Exception as exc:  # noqa: BLE001 - ours, not the client's: log, answer 500
            log.exception("admitting %s failed", request_id)
            self._finish(active, Progress([], finish_reason="error", error_type=INTERNAL), 0, 0)
            raise OpenAIError(500, ENGINE_FAILED, code="internal_error",
                              type_="server_error") from exc
        except BaseException:  # cancelled: the server is shutting down mid-admission
            self._finish(active, Progress([], finish_reason="abort", error_type=ABORT), 0, 0)
            raise
        # Recorded only once the engine accepted it (a 1e23 made every batch unexportable).
        active.attrs["gen_ai.request.max_tokens"] = req.max_tokens
        headers = {"Server-Timing": active.server_timing, "X-Request-Id": request_id}
        fmt = ChunkFormatter(request_id, self.model_name, int(time.time()), chat=chat)
        if req.stream:
            return stream_response(
                active, stream, fmt, headers, include_usage=req.include_usage,
                timing=self.inband if wants_timing(request.scope) else None, plan=plan,
                clock_ns=self.clock_ns, finish=self._finish)
        return await collect_response(request, active, stream, chat=chat, headers=headers,
                                      plan=plan, model_name=self.model_name,
                                      clock_ns=self.clock_ns, finish=self._finish)

    def _finish(self, active: ActiveRequest, progress: Progress, num_prompt_tokens: int,
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

