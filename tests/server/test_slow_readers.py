"""Streams opened and never read (issue 22, item 9): each is aborted as a slow reader once
its output queue is full, its KV blocks come back, and a bystander is served meanwhile.

The real engine and the real app under uvicorn on loopback. Two buffers are made small so
TCP backpressure bites after a few KB instead of the ~1.7 MB loopback buffers otherwise
absorb (~10k events, more than a short test generates): the server's send buffer (set on
the listening socket, which accepted sockets inherit; it also stops Linux autotuning it) and
the transport's write-buffer high-water mark (asyncio's default is 64 KiB). Neither changes
what is tested: the bound between the engine and the SSE writer.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.server.app import ServerSettings, create_app
from tracer.record.errors import SLOW_READER

URL = "/v1/chat/completions"
# The issue opened 200 streams against 64 slots; 12 against 4 slots keeps that ratio (3
# waves of stalled streams ahead of the bystander) at a batch two shared cores step through
# quickly. Each stream is aborted ~25 tokens in (its buffers plus the bound), so the bystander
# waits ~75 steps: measured 10 s TTFT, 25 s in all, with 3 other test runs on the 2 cores.
# 200 x 64 would take minutes here; without the bound the bystander waits for 12 x 1500
# tokens and times out (checked with max_pending_outputs=10**9).
NUM_SLOTS = 4
NUM_UNREAD = 12
MAX_PENDING_OUTPUTS = 4
# Without the bound each unread stream would hold its slot for all of these tokens.
UNREAD_MAX_TOKENS = 1500
# Linux raises a send buffer this small to its minimum (~4.5 KB).
SEND_BUFFER_BYTES = 1024
WRITE_BUFFER_HIGH_BYTES = 1024
CLIENT_RECEIVE_BUFFER_BYTES = 1024
BYSTANDER_TTFT_BOUND_S = 30.0
# An unread stream ends this far in at most: its few KB of buffers hold ~25 events.
MAX_TOKENS_BEFORE_ABORT = 200
DEADLINE_S = 60.0


class _SmallWriteBuffer(HttpToolsProtocol):
    def connection_made(self, transport) -> None:  # type: ignore[override]
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        super().connection_made(transport)


def _wait_until(condition, what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout_s} s"
        threading.Event().wait(0.02)


@pytest.fixture
def small_buffer_server(loaded_model):
    engine = LLMEngine(EngineConfig(num_kv_blocks=512, max_num_seqs=NUM_SLOTS),
                       loaded=loaded_model)
    parts = create_app(engine, ServerSettings(max_pending_outputs=MAX_PENDING_OUTPUTS),
                       registry=CollectorRegistry())
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(parts.app, log_level="critical", lifespan="on",
                            http=_SmallWriteBuffer, proxy_headers=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[listener])),
                              daemon=True)
    thread.start()
    _wait_until(lambda: server.started, "server started")
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", parts, engine
    server.should_exit = True
    thread.join(timeout=30)


def _open_unread_stream(base_url: str, body: dict) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    # Before connect, so the window the client advertises is small from the handshake on.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER_BYTES)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def test_unread_streams_are_aborted_and_a_bystander_is_served(small_buffer_server):
    base_url, parts, engine = small_buffer_server
    aengine = parts.aengine
    free_blocks = engine.block_manager.num_free_blocks
    model = engine.model_name
    unread = [_open_unread_stream(base_url, {
        "model": model, "stream": True, "ignore_eos": True, "temperature": 0,
        "max_tokens": UNREAD_MAX_TOKENS,
        "messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}]})
        for i in range(NUM_UNREAD)]
    try:
        # Every unread stream is in the engine (or already aborted) before the bystander.
        _wait_until(lambda: sum(aengine.stats()[:2]) + aengine.num_slow_readers >= NUM_UNREAD,
                    "unread streams admitted")
        assert aengine.stats()[0] <= NUM_SLOTS
        start_s = time.monotonic()
        ttft_s = None
        text = ""
        with httpx.stream("POST", base_url + URL, timeout=DEADLINE_S, json={
                "model": model, "stream": True, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Hi"}]}) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                assert "error" not in chunk, chunk
                delta = chunk["choices"][0]["delta"].get("content") or ""
                if delta and ttft_s is None:
                    ttft_s = time.monotonic() - start_s
                text += delta
        assert ttft_s is not None and text
        assert ttft_s < BYSTANDER_TTFT_BOUND_S, f"bystander TTFT {ttft_s:.1f} s"

        _wait_until(lambda: aengine.num_slow_readers == NUM_UNREAD, "all unread aborted")
        _wait_until(lambda: not engine.has_unfinished() and parts.obs.tracer.is_idle(30),
                    "engine and tracer idle")
        assert engine.block_manager.num_free_blocks == free_blocks
        assert engine.block_manager.num_used_blocks == 0
        records = parts.obs.store.recent(NUM_UNREAD + 1)
        slow = [r for r in records if r.error_type == SLOW_READER]
        assert len(slow) == NUM_UNREAD
        assert all(r.finish_reason == "abort" for r in slow)
        # Aborted at the bound, long before the tokens they asked for.
        assert all(r.num_output_tokens < MAX_TOKENS_BEFORE_ABORT for r in slow)
        (bystander,) = [r for r in records if r.error_type is None]
        assert bystander.finish_reason == "length" and bystander.num_output_tokens == 8
    finally:
        for sock in unread:
            sock.close()
