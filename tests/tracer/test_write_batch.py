"""Write batching (tracer/web/write_batch.py): a held write leaves with the next one, or at the
end of the loop turn; and the guarded protocol offers it to every request."""
from __future__ import annotations

import asyncio

from tracer.testing.transport import RecordingTransport, serve_request
from tracer.web.write_batch import WRITE_BATCH, BatchingTransport, write_batch_hold


class TurnLoop:
    """`call_soon` collected, run when the test ends the loop's turn."""

    def __init__(self) -> None:
        self.soon: list = []

    def call_soon(self, callback) -> None:
        self.soon.append(callback)

    def end_turn(self) -> None:
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()


def batching() -> tuple[BatchingTransport, RecordingTransport, TurnLoop]:
    inner, loop = RecordingTransport(), TurnLoop()
    return BatchingTransport(inner, loop), inner, loop


def test_without_hold_every_write_goes_at_once():
    transport, inner, loop = batching()
    transport.write(b"a")
    transport.write(b"b")
    assert inner.calls == [b"a", b"b"] and loop.soon == []


def test_a_held_write_leaves_with_the_next_one_in_one_call():
    transport, inner, loop = batching()
    transport.hold()
    transport.write(b"head")
    assert inner.calls == []
    transport.write(b"body")
    transport.write(b"more")
    assert inner.calls == [b"headbody", b"more"]
    loop.end_turn()   # the fallback flush finds nothing left
    assert inner.calls == [b"headbody", b"more"]


def test_a_held_write_with_no_follower_leaves_at_the_end_of_the_turn():
    transport, inner, loop = batching()
    transport.hold()
    transport.write(b"head")
    loop.end_turn()
    assert inner.calls == [b"head"]
    transport.write(b"later")   # holding is over: no extra delay for what follows
    assert inner.calls == [b"head", b"later"]


def test_holding_twice_joins_three_writes():
    transport, inner, _ = batching()
    transport.hold()
    transport.write(b"a")
    transport.hold()
    transport.write(b"b")
    transport.write(b"c")
    assert inner.calls == [b"abc"]


def test_close_writes_what_is_held_first_and_abort_drops_it():
    transport, inner, _ = batching()
    transport.hold()
    transport.write(b"last")
    transport.close()
    assert inner.calls == [b"last"] and inner.closed
    transport, inner, _ = batching()
    transport.hold()
    transport.write(b"unsent")
    transport.abort()
    assert inner.calls == [] and inner.aborted


def test_a_flush_after_close_writes_nothing():
    transport, inner, loop = batching()
    transport.hold()
    transport.write(b"x")
    inner.closed = True      # the peer went away meanwhile
    loop.end_turn()
    assert inner.calls == []


def test_everything_else_is_the_wrapped_transports():
    transport, inner, _ = batching()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 50000)
    assert transport.is_closing() is False


# --- the guarded protocol offers it to each request ---------------------------------------

REQUEST = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"


def serve_one(app) -> list[bytes]:
    return asyncio.run(serve_request(app, REQUEST))


def sse_app(*, hold_head: bool, hold_last: bool):
    async def app(scope, receive, send):
        await receive()
        hold = write_batch_hold(scope)
        assert hold is not None, "the guarded protocol offers write batching"
        if hold_head:
            hold()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        if hold_last:
            hold()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


def test_the_protocol_writes_each_message_alone_unless_asked():
    calls = serve_one(sse_app(hold_head=False, hold_last=False))
    assert len(calls) == 4
    assert calls[0].startswith(b"HTTP/1.1 200 OK") and calls[0].endswith(b"\r\n\r\n")
    assert calls[1:] == [b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]


def test_the_protocol_sends_the_head_with_the_first_body_and_the_last_with_the_end():
    calls = serve_one(sse_app(hold_head=True, hold_last=True))
    assert len(calls) == 2
    head, _, body = calls[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b"9\r\ndata: 1\n\n\r\n"
    assert calls[1] == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"


def test_the_extension_is_announced_in_the_scope():
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope.get("extensions", {}))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    serve_one(app)
    assert set(seen[WRITE_BATCH]) == {"hold"}
