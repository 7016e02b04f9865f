"""Server-sent event framing for OpenAI-style streams, kept cheap on the per-token path.

The first event a client sees carries the assistant role *and* the first non-empty content:
an earlier role-only chunk would make naive clients read TTFT as near zero
(docs/reference.md, "How benchmark clients define the numbers").
"""
from __future__ import annotations

import json

# The end-of-stream event, under the name serving.py sends it by.
from tracer.record.sse_vocabulary import DONE_EVENT_BYTES as DONE  # noqa: F401 - re-exported
from tracer.web.openai_http import OpenAIError


class ChunkFormatter:
    """Formats the events of one streamed response.

    >>> f = ChunkFormatter("chatcmpl-1", "m", 0, chat=True)
    >>> f.content("Hi", first=True)[:6]
    b'data: '
    """

    __slots__ = ("_head", "_chat")

    def __init__(self, completion_id: str, model: str, created_s: int, *, chat: bool) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        # Everything before the choices never changes within a stream: encode it once.
        self._head = (f'data: {{"id":{json.dumps(completion_id)},"object":"{obj}",'
                      f'"created":{created_s},"model":{json.dumps(model)},"choices":')
        self._chat = chat

    def content(self, text: str, *, first: bool, finish_reason: str | None = None) -> bytes:
        reason = "null" if finish_reason is None else json.dumps(finish_reason)
        if self._chat:
            role = '"role":"assistant",' if first else ""
            choice = (f'[{{"index":0,"delta":{{{role}"content":{json.dumps(text)}}},'
                      f'"logprobs":null,"finish_reason":{reason}}}]')
        else:
            choice = (f'[{{"index":0,"text":{json.dumps(text)},"logprobs":null,'
                      f'"finish_reason":{reason}}}]')
        return (self._head + choice + "}\n\n").encode()

    def tool_call(self, index: int, arguments: str, *, first: bool, call_id: str | None = None,
                  name: str | None = None) -> bytes:
        """A `tool_calls` delta (chat only): a call's first carries its id and name, then
        its arguments arrive in fragments. The stream's first event also carries the role,
        with `content: null` as OpenAI sends it before a call.

        >>> f = ChunkFormatter("c", "m", 0, chat=True)
        >>> import json
        >>> event = f.tool_call(0, "", first=False, call_id="call_1", name="f")
        >>> json.loads(event[6:])["choices"][0]["delta"]
        {'tool_calls': [{'index': 0, 'id': 'call_1', 'type': 'function', 'function': {'name': 'f', 'arguments': ''}}]}
        """
        role = '"role":"assistant","content":null,' if first else ""
        head = (f'{{"index":{index},"id":{json.dumps(call_id)},"type":"function",'
                f'"function":{{"name":{json.dumps(name)},' if call_id is not None
                else f'{{"index":{index},"function":{{')
        return (self._head + f'[{{"index":0,"delta":{{{role}"tool_calls":[{head}'
                f'"arguments":{json.dumps(arguments)}}}}}]}},"logprobs":null,'
                '"finish_reason":null}]' + "}\n\n").encode()

    def finish(self, finish_reason: str, *, first: bool) -> bytes:
        """The closing chunk: no content, the finish reason (role too if nothing was sent)."""
        if not self._chat:
            return self.content("", first=first, finish_reason=finish_reason)
        delta = '{"role":"assistant","content":""}' if first else "{}"
        return (self._head + f'[{{"index":0,"delta":{delta},"logprobs":null,'
                f'"finish_reason":{json.dumps(finish_reason)}}}]' + "}\n\n").encode()

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """The usage-only chunk (`choices: []`): not a token, sent last before [DONE]."""
        return (self._head + "[]," + json.dumps({"usage": usage_dict(
            prompt_tokens, completion_tokens, cached_tokens)})[1:-1] + "}\n\n").encode()


def error_event(message: str, type_: str = "server_error", code: str | None = None) -> bytes:
    return OpenAIError(500, message, code=code, type_=type_).sse_event()


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
