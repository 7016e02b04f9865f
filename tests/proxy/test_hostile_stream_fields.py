"""A hostile field in an upstream's answer is a field to drop, never a reason to lose the
request (issue 39, break 9): JSON nested past the interpreter's stack, in a stream event of
every format the proxy parses or in a whole body, and a llama.cpp `timings` object whose
keys collide with `Timeline.event`'s own parameters. The client gets every byte the
upstream sent, the record keeps the stream's true outcome, and no join slot is left."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from test_hostile_upstream import RawUpstream
from tracer.testing.fake_upstream import MODEL

DEEP = b'{"a":' * 5_000 + b"1" + b"}" * 5_000            # past any recursion limit
DEEP_ERROR = b'{"error":' + b"[" * 5_000 + b"]" * 5_000 + b"}"   # read as a summary event
WAIT_S = 20.0


def _events(*objs) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode())
                    + b"\n\n" for o in objs)


def _chat(text: str | None = None, finish: str | None = None, **extra) -> dict:
    delta = {"content": text} if text is not None else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


# (path, request body, the upstream's stream): each has a deep event before its first
# token, and the chat stream one after it too (read there only when it may carry a summary).
STREAMS = {
    "chat": ("/v1/chat/completions", _events(
        _chat(), DEEP, _chat("Hi"), DEEP_ERROR, _chat(finish="stop"), b"[DONE]")),
    "anthropic": ("/v1/messages", _events(
        {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}, DEEP,
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}, DEEP,
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"})),
    "responses": ("/v1/responses", _events(
        {"type": "response.created"}, DEEP,
        {"type": "response.output_text.delta", "delta": "Hi"}, DEEP,
        {"type": "response.completed", "response": {"status": "completed"}})),
}
BODIES = {   # the same, not streamed: a whole JSON body nested too deeply
    "chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}


class StaticUpstream(RawUpstream):
    """Answers every request with one body, then closes. It reads the request's body first:
    a socket closed with unread bytes is reset, and the reset can beat the answer."""

    def __init__(self, ctype: bytes, body: bytes) -> None:
        async def answer(server, writer) -> None:
            await server.write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n"
                               b"content-length: %d\r\nconnection: close\r\n\r\n"
                               % (ctype, len(body)) + body)
        super().__init__(answer)

    async def _on_connect(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length:[ \t]*(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)
        try:
            await self.scenario(self, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            writer.close()


def _upstream(ctype: bytes, body: bytes) -> StaticUpstream:
    return StaticUpstream(ctype, body)


def _ask(proxy, path: str, stream: bool) -> httpx.Response:
    body = {"model": MODEL, "stream": stream, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(proxy.base_url + path, json=body, timeout=WAIT_S)


def _record(proxy):
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(10)
    return record


def _no_slot_left(proxy) -> None:
    join = proxy.parts.join
    assert join is not None and join.num_expected == 0 and join.num_pending == 0


@pytest.mark.parametrize("fmt", list(STREAMS))
def test_a_deep_stream_event_is_relayed_and_dropped(proxy_factory, fmt):
    path, stream = STREAMS[fmt]
    with _upstream(b"text/event-stream", stream) as upstream:
        proxy = proxy_factory(upstream.base_url)
        response = _ask(proxy, path, stream=True)
    assert response.status_code == 200
    assert response.content == stream   # every byte, and no error event of ours
    record = _record(proxy)
    assert (record.finish_reason, record.error_type) == ("stop", None)
    assert record.ttft_ns is not None
    _no_slot_left(proxy)


@pytest.mark.parametrize("fmt", list(BODIES))
def test_a_deep_whole_body_is_relayed_and_dropped(proxy_factory, fmt):
    with _upstream(b"application/json", DEEP) as upstream:
        proxy = proxy_factory(upstream.base_url)
        response = _ask(proxy, BODIES[fmt], stream=False)
    assert response.status_code == 200 and response.content == DEEP
    record = _record(proxy)
    assert (record.finish_reason, record.error_type) == ("stop", None)
    _no_slot_left(proxy)


def test_timings_keys_that_name_the_events_own_parameters_are_kept_as_fields(proxy_factory):
    timings = {"name": 1, "t_ns": 2, "self": 3, "attrs": 4, "prompt_n": 5, "prompt_ms": 1.5,
               "predicted_n": 1}
    stream = _events(_chat("Hi"), _chat(finish="stop", timings=timings), b"[DONE]")
    with _upstream(b"text/event-stream", stream) as upstream:
        proxy = proxy_factory(upstream.base_url)
        responses = [_ask(proxy, "/v1/chat/completions", stream=True) for _ in range(3)]
    assert all(r.content == stream for r in responses)
    proxy.wait_idle()
    records = proxy.parts.obs.store.recent(10)
    assert len(records) == 3   # none lost
    for record in records:
        assert (record.finish_reason, record.num_prompt_tokens) == ("stop", 5)
        (attrs,) = [a for name, _, a in record.events if name == "upstream_timings"]
        assert attrs == timings
    _no_slot_left(proxy)


def test_a_huge_timings_object_keeps_a_bounded_event(proxy_factory):
    timings = {f"k{i}": i for i in range(10_000)} | {"prompt_ms": 1.5, "prompt_n": 5}
    stream = _events(_chat("Hi"), _chat(finish="stop", timings=timings), b"[DONE]")
    with _upstream(b"text/event-stream", stream) as upstream:
        proxy = proxy_factory(upstream.base_url)
        assert _ask(proxy, "/v1/chat/completions", stream=True).content == stream
    record = _record(proxy)
    (attrs,) = [a for name, _, a in record.events if name == "upstream_timings"]
    assert 0 < len(attrs) <= 64 and record.num_prompt_tokens == 5
    _no_slot_left(proxy)


@pytest.mark.parametrize("kind", [{"a": 1}, [1], 1e400, None])
def test_an_event_type_of_any_json_type_is_dropped(proxy_factory, kind):
    # Found by tests/reliability/test_stream_fuzz.py: a Responses event whose `type` was an
    # object raised TypeError (unhashable) in the scanner and cut the client's stream.
    odd = b'{"type":' + (b"1e400" if kind == 1e400 else json.dumps(kind).encode()) + b"}"
    stream = _events({"type": "response.output_text.delta", "delta": "Hi"}, odd,
                     {"type": "response.completed", "response": {"status": "completed"}})
    with _upstream(b"text/event-stream", stream) as upstream:
        proxy = proxy_factory(upstream.base_url)
        response = _ask(proxy, "/v1/responses", stream=True)
    assert response.content == stream
    record = _record(proxy)
    assert (record.finish_reason, record.error_type) == ("stop", None)
    _no_slot_left(proxy)
