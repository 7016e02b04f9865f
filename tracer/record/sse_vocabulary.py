"""The words of the event streams that more than one part reads or writes.

`data: [DONE]` ends an OpenAI chat or completion stream (not an SSE rule: the OpenAI API's
own sentinel, which vLLM and SGLang copy); everything before it is a JSON event. Anthropic
Messages and the Responses API end with an event of their own `type` instead (the proxy's
scanner, tracer/proxy/formats.py, and the load generator, tracer/bench/endpoints.py, read
them from here).
"""
from __future__ import annotations

# The `data` field of the event that ends the stream.
DONE_DATA = "[DONE]"
DONE_DATA_BYTES = DONE_DATA.encode("ascii")
# The whole event as OpenAI writes it: one `data` line, then the blank line that ends it.
DONE_EVENT_BYTES = b"data: " + DONE_DATA_BYTES + b"\n\n"

# Anthropic Messages (@anthropic-ai/sdk 1.10.0, RawMessageStreamEvent): the stream's last event.
ANTHROPIC_END_EVENT = "message_stop"
# The Responses API (openai 7.59.0, ResponseStreamEvent): the three ways a stream ends.
RESPONSES_COMPLETED = "response.completed"
RESPONSES_INCOMPLETE = "response.incomplete"
RESPONSES_FAILED = "response.failed"
RESPONSES_END_EVENTS = frozenset((RESPONSES_COMPLETED, RESPONSES_INCOMPLETE, RESPONSES_FAILED))
# The event type both APIs use for an in-band error.
ERROR_EVENT = "error"
