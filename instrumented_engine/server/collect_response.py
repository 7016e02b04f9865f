"""A completion answered whole (`"stream": false`): the engine's output collected while the
client is watched for leaving, then one JSON body, or the error that ended it.

Nothing is sent before the whole body: TTFT here is the first text being ready, and of a
tool call too (its calls are all handed over with the body).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from instrumented_engine.engine.request_stream import RequestStream
from instrumented_engine.server.progress import ENGINE_FAILED, FinishRecord, Progress
from instrumented_engine.server.protocol import OpenAIError
from instrumented_engine.server.sse import usage_dict
from instrumented_engine.server.tool_call_output import time_collected_calls, tool_calls_message
from instrumented_engine.server.tool_choice import ToolPlan
from tracer.core.request_tracer import ActiveRequest
from tracer.record.errors import ABORT, INTERNAL
from tracer.web.openai_http import CLIENT_CLOSED_REQUEST

log = logging.getLogger(__name__)


async def collect_response(request: Request, active: ActiveRequest, stream: RequestStream, *,
                           chat: bool, headers: dict, plan: ToolPlan | None, model_name: str,
                           clock_ns: Callable[[], int], finish: FinishRecord) -> Response:
    progress = Progress([])
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
            time_collected_calls(active.timeline, calls, first_text_ns, clock_ns())
        finish(active, progress, stream.num_prompt_tokens, stream.num_cached_tokens)
    if failure is not None:
        return OpenAIError(500, ENGINE_FAILED, code="internal_error",
                           type_="server_error").response(headers=headers)
    if progress.error_type == ABORT:
        return OpenAIError(CLIENT_CLOSED_REQUEST, "The client closed the request.",
                           code="client_closed_request").response(headers=headers)
    text = "".join(progress.text_parts)
    if calls is not None:
        choice = {"index": 0, "message": tool_calls_message(calls)}
    else:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                  if chat else {"index": 0, "text": text})
    choice.update(logprobs=None, finish_reason=progress.finish_reason if plan is None
                  else plan.finish_reason(progress.finish_reason))
    return JSONResponse({"id": active.request_id,
                         "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": model_name,
                         "choices": [choice],
                         "usage": usage_dict(stream.num_prompt_tokens,
                                             progress.num_output_tokens,
                                             stream.num_cached_tokens)}, headers=headers)


async def _drain(stream: RequestStream, progress: Progress) -> None:
    async for out in stream:
        progress.text_parts.append(out.text)
        progress.num_output_tokens = out.num_output_tokens
        if out.finished:
            progress.finish_reason = out.finish_reason


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
