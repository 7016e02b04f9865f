"""The APIs `tracer bench --endpoint` can load: where each lives, what its stream looks like.

OpenAI chat and completions end with `data: [DONE]`; Anthropic Messages (vLLM and SGLang serve
`/v1/messages` too) ends with a `message_stop` event; the Responses API with
`response.completed`. Content is judged by the stream format's rule
(`tracer.record.first_content`, the one the proxy and the browser probe use), so a role-only,
start, ping, usage or reasoning event is never a token in any of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.record.sse_vocabulary import (
    ANTHROPIC_END_EVENT,
    ERROR_EVENT,
    RESPONSES_COMPLETED,
    RESPONSES_FAILED,
    RESPONSES_INCOMPLETE,
)

__all__ = ["ENDPOINTS", "Endpoint"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    stream_format: str           # tracer.record.first_content.FORMATS
    end_event: str | None        # the event `type` that ends the stream; None: `data: [DONE]`
    failed_events: tuple[str, ...] = ()   # event types that end it with an error


ENDPOINTS: dict[str, Endpoint] = {
    "chat": Endpoint("/v1/chat/completions", "openai", None),
    "completions": Endpoint("/v1/completions", "openai", None),
    "messages": Endpoint("/v1/messages", "anthropic", ANTHROPIC_END_EVENT, (ERROR_EVENT,)),
    "responses": Endpoint("/v1/responses", "openai-responses", RESPONSES_COMPLETED,
                          (ERROR_EVENT, RESPONSES_FAILED, RESPONSES_INCOMPLETE)),
}
