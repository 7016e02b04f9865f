"""The words of an OpenAI-style event stream that more than one part reads or writes.

`data: [DONE]` ends an OpenAI chat or completion stream (not an SSE rule: the OpenAI API's
own sentinel, which vLLM and SGLang copy); everything before it is a JSON event.
"""
from __future__ import annotations

# The `data` field of the event that ends the stream.
DONE_DATA = "[DONE]"
DONE_DATA_BYTES = DONE_DATA.encode("ascii")
# The whole event as OpenAI writes it: one `data` line, then the blank line that ends it.
DONE_EVENT_BYTES = b"data: " + DONE_DATA_BYTES + b"\n\n"
