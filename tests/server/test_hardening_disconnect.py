"""A client that leaves a non-streamed request aborts it (issue 13, item 5): generation stops,
its KV blocks come back, and its record says `abort` in the shared error vocabulary."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx

URL = "/v1/chat/completions"
MAX_TOKENS = 300


def _wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        threading.Event().wait(0.01)


def _send_raw(srv, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    host, port = srv.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def _max_output_tokens(srv) -> int:
    with srv.parts.aengine._lock:  # the step thread mutates the requests under this lock
        return max((st.seq.num_output_tokens for st in srv.engine._requests.values()), default=0)


def _duration_count(srv, error_type: str) -> float:
    total = 0.0
    for line in httpx.get(srv.base_url + "/metrics").text.splitlines():
        if (line.startswith("gen_ai_server_request_duration_seconds_count{")
                and f'error_type="{error_type}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_non_streamed_disconnect_aborts_and_frees_blocks(server_factory):
    srv = server_factory()
    free_blocks = srv.engine.block_manager.num_free_blocks
    sock = _send_raw(srv, {"model": srv.model, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                           "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]})
    # A few tokens in, then the client vanishes without reading anything.
    _wait_until(lambda: _max_output_tokens(srv) >= 3)
    sock.close()
    srv.wait_idle()
    assert srv.engine.block_manager.num_free_blocks == free_blocks
    assert srv.engine.block_manager.num_used_blocks == 0
    (record,) = srv.parts.obs.store.recent(1)
    assert record.finish_reason == "abort" and record.error_type == "abort"
    assert 3 <= record.num_output_tokens < MAX_TOKENS
    assert _duration_count(srv, "abort") == 1.0 and _duration_count(srv, "other") == 0.0


def test_streamed_disconnect_is_labelled_abort_not_other(server_factory):
    srv = server_factory()
    sock = _send_raw(srv, {"model": srv.model, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                           "stream": True, "messages": [{"role": "user", "content": "Hi"}]})
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(65536)
    sock.close()
    srv.wait_idle()
    (record,) = srv.parts.obs.store.recent(1)
    assert record.finish_reason == "abort" and record.error_type == "abort"
    assert _duration_count(srv, "abort") == 1.0 and _duration_count(srv, "other") == 0.0
