"""Helpers for the reliability suite: apps served on loopback in their own thread, bounded
waits, raw sockets."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from tracer.web.quiet_server import QuietServer


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll `predicate` until true or `timeout_s` passes (a bounded wait, not a sleep)."""
    deadline, tick = time.monotonic() + timeout_s, threading.Event()
    while time.monotonic() < deadline:
        if predicate():
            return True
        tick.wait(0.005)
    return predicate()


@dataclass
class Served:
    host: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def connect(self, timeout_s: float = 10.0) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=timeout_s)

    def num_connections(self) -> int:
        return len(self.server.server_state.connections)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve(app, **options) -> Served:
    """`app` on 127.0.0.1 (a free port) under uvicorn with `options`, in a daemon thread."""
    ready, holder = threading.Event(), {}

    def run() -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                lifespan="on", **options)
        server = QuietServer(config)
        holder["server"] = server

        async def main() -> None:
            task = asyncio.create_task(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.002)
            ready.set()
            await task
        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30) and holder["server"].started, "server did not start"
    port = holder["server"].servers[0].sockets[0].getsockname()[1]
    return Served("127.0.0.1", port, holder["server"], thread)


def read_response(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """Everything the server sends until it closes or `timeout_s` passes; b"" on a reset."""
    sock.settimeout(timeout_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out


def read_one_response(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """One HTTP/1.1 response with a Content-Length body, leaving the connection open."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def status_of(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1.1 "):
        return None
    return int(response[9:12])


def is_closed(sock: socket.socket, timeout_s: float) -> bool:
    """True when the peer closes (or resets) the connection within `timeout_s`."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
