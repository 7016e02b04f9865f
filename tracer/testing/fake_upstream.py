"""A small, deterministic OpenAI-compatible upstream for the proxy's tests and benchmarks.

Raw asyncio HTTP/1.1 (keep-alive, chunked SSE; tracer/testing/fake_http.py), so the upstream
is neither slow nor noisy: it streams `chunks` content events `gap_ms` apart, and misbehaves
on request, chosen by the `x-fake-mode` request header (the proxy forwards it):

    stream (default)  role-only event, `chunks` content events, finish event, [DONE]
    status_500        a 500 with an OpenAI-shaped error body
    slow_headers      no response until the client gives up (a read timeout upstream)
    cut               three content events, then the connection is dropped mid-body
    hold              one content event, then nothing until the client disconnects
    linger            the whole stream and [DONE], but the body stays open until the client
                      disconnects (as SDKs do right after [DONE])
    llamacpp          the stream, its last chunk carrying llama.cpp's `timings`
                      (`prompt_ms` from `x-fake-prompt-ms`, `cache_n` from `x-fake-cache-n`)
    tgi               a non-streamed answer with TGI's timing headers (`x-fake-tgi-ms`:
                      "total,validation,queue,inference")
    vllm_metrics      the stream, then vLLM's final usage chunk (`choices: []`) carrying
                      the `metrics` object given as JSON in `x-fake-vllm-metrics`

A path given a `Recording` (e.g. `/v1/messages` with a recorded Anthropic stream) answers
every streamed request with that body, byte for byte, written in the recorded reads, with an
optional pause before one of them (an engine's prefill before its first text).

`x-fake-chunks` and `x-fake-gap-ms` override the defaults per request;
`x-fake-first-token-delay-ms` waits before the first content (an engine's queue and prefill).
Each request's arrival and first-content times (wall clock) are kept on its `SeenRequest`, so
a test can build the span an engine would have made for it. It also accepts
OTLP/HTTP span exports on `/v1/traces` (answered with an empty success). What it saw
(requests, disconnects, open connections) is kept for the tests.

    python -m tracer.testing.fake_upstream --port 9001 --chunks 32 --gap-ms 5
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from tracer.record.sse_vocabulary import DONE_EVENT_BYTES
from tracer.testing.fake_engine_timing import FAKE_METRICS, _llamacpp_timings, _tgi_headers
from tracer.testing.fake_http import SeenRequest, _chunk, _json, _read_request, _send
from tracer.testing.recording import Recording

MODEL = "fake-model"


@dataclass
class FakeState:
    """What the fake upstream observed; events are set from its loop thread.

    >>> FakeState().disconnected_while_busy.is_set()
    False
    """

    requests: list[SeenRequest] = field(default_factory=list)
    num_open_connections: int = 0
    num_span_exports: int = 0
    num_disconnects_while_busy: int = 0
    disconnected_while_busy: threading.Event = field(default_factory=threading.Event)


class FakeUpstream:
    """The fake server on 127.0.0.1, in a thread with its own event loop.

    >>> upstream = FakeUpstream(chunks=4, gap_ms=0).start()
    >>> upstream.base_url.startswith("http://127.0.0.1:")
    True
    >>> upstream.stop()
    """

    def __init__(self, *, chunks: int = 8, gap_ms: float = 0.0, port: int = 0,
                 recordings: dict[str, Recording] | None = None) -> None:
        self.chunks, self.gap_ms, self.port = chunks, gap_ms, port
        self.recordings = dict(recordings or {})   # path → the body it replays
        self.state = FakeState()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeUpstream:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake upstream did not start")
        return self

    def _run(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self.handle, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.state.num_open_connections += 1
        try:
            while (request := await _read_request(reader)) is not None:
                if request.path == "/v1/traces":
                    self.state.num_span_exports += 1   # not kept: a sink, not a witness
                else:
                    self.state.requests.append(request)
                if not await self._respond(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self.state.num_open_connections -= 1
            writer.close()

    async def _respond(self, request: SeenRequest, reader, writer) -> bool:
        """Answer one request; False when the connection must not be reused."""
        mode = request.headers.get("x-fake-mode", "stream")
        if request.path.startswith("/v1/models"):
            return await _json(writer, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "owned_by": "fake"}]})
        if request.path == "/v1/traces":   # an OTLP/HTTP sink: the benchmark exports here
            return await _send(writer, 200, b"application/x-protobuf", b"")
        if request.path == "/metrics":
            return await _send(writer, 200, b"text/plain; version=0.0.4", FAKE_METRICS)
        if mode == "status_500":
            return await _json(writer, 500, {"error": {"message": "fake failure",
                               "type": "server_error", "param": None, "code": None}})
        if mode == "slow_headers":
            await self._until_disconnect(reader)
            return False
        recording = self.recordings.get(request.path)
        if recording is not None:
            return await self._replay(request, recording, writer)
        chat = request.path.endswith("/chat/completions")
        delay_s = float(request.headers.get("x-fake-first-token-delay-ms", 0)) / 1e3
        if json.loads(request.body or b"{}").get("stream") is not True:
            if delay_s:
                await asyncio.sleep(delay_s)
            request.first_content_epoch_ns = time.time_ns()
            answer = _whole_answer(self._num_chunks(request), chat)
            return await _json(writer, 200, answer, _tgi_headers(request) if mode == "tgi" else b"")
        return await self._stream(request, mode, chat, reader, writer, delay_s)

    def _num_chunks(self, request: SeenRequest) -> int:
        return int(request.headers.get("x-fake-chunks", self.chunks))

    async def _stream(self, request, mode: str, chat: bool, reader, writer,
                      delay_s: float = 0.0) -> bool:
        gap_s = float(request.headers.get("x-fake-gap-ms", self.gap_ms)) / 1e3
        num_chunks = {"cut": 3, "hold": 1}.get(mode, self._num_chunks(request))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n"
                     b"x-request-id: fake-upstream-1\r\n\r\n")
        if chat:
            writer.write(_chunk(_event({"delta": {"role": "assistant", "content": ""}}, chat)))
        await writer.drain()
        if delay_s:
            await asyncio.sleep(delay_s)
        for i in range(num_chunks):
            if gap_s and i:
                await asyncio.sleep(gap_s)
            if not i:
                request.first_content_epoch_ns = time.time_ns()
            writer.write(_chunk(_event(_piece(i, chat), chat)))
            await writer.drain()
        if mode == "cut":
            writer.transport.abort()   # mid-body, no terminating chunk: a broken stream
            return False
        if mode == "hold":
            await self._until_disconnect(reader)
            return False
        last = _event(_finish(chat), chat)
        if mode == "llamacpp":
            last = _event(_finish(chat), chat, timings=_llamacpp_timings(request, num_chunks))
        if mode == "vllm_metrics":   # tracer/engines/vllm_metrics.py: the final usage chunk
            last += _usage_chunk(num_chunks, chat, json.loads(request.headers["x-fake-vllm-metrics"]))
        writer.write(_chunk(last + DONE_EVENT_BYTES))
        if mode == "linger":
            await self._until_disconnect(reader)
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _replay(self, request: SeenRequest, recording: Recording, writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncache-control: no-cache\r\n"
                     b"transfer-encoding: chunked\r\nx-request-id: fake-upstream-1\r\n\r\n"
                     % recording.content_type)
        await writer.drain()
        offset = 0
        for piece in recording.pieces():
            if offset == recording.hold_at and recording.hold_ms:
                await asyncio.sleep(recording.hold_ms / 1e3)   # the engine's prefill
                request.first_content_epoch_ns = time.time_ns()
            writer.write(_chunk(piece))
            await writer.drain()
            offset += len(piece)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _until_disconnect(self, reader: asyncio.StreamReader) -> None:
        # The request body is read: the next read returns b"" exactly when the client closes.
        if await reader.read(1) == b"":
            self.state.num_disconnects_while_busy += 1
            self.state.disconnected_while_busy.set()


def _piece(i: int, chat: bool) -> dict:
    text = f"tok{i} "
    return {"delta": {"content": text}} if chat else {"text": text}


def _finish(chat: bool) -> dict:
    return {"delta": {}, "finish_reason": "stop"} if chat else {"text": "", "finish_reason": "stop"}


def _event(choice: dict, chat: bool, timings: dict | None = None) -> bytes:
    obj = {"id": "fake-1", "object": "chat.completion.chunk" if chat else "text_completion",
           "created": 0, "model": MODEL, "choices": [{"index": 0, "finish_reason": None, **choice}]}
    if timings is not None:
        obj["timings"] = timings
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _usage_chunk(num_chunks: int, chat: bool, metrics) -> bytes:
    obj = {"id": "fake-1", "object": "chat.completion.chunk" if chat else "text_completion",
           "created": 0, "model": MODEL, "choices": [], "metrics": metrics,
           "usage": {"prompt_tokens": 5, "completion_tokens": num_chunks,
                     "total_tokens": 5 + num_chunks}}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _whole_answer(num_chunks: int, chat: bool) -> dict:
    text = "".join(f"tok{i} " for i in range(num_chunks))
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
              else {"index": 0, "text": text})
    return {"id": "fake-1", "object": "chat.completion" if chat else "text_completion",
            "created": 0, "model": MODEL, "choices": [{**choice, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": num_chunks,
                      "total_tokens": 5 + num_chunks}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    upstream = FakeUpstream(chunks=args.chunks, gap_ms=args.gap_ms, port=args.port)
    upstream.start()
    print(f"fake upstream on {upstream.base_url}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
