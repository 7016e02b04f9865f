"""A transport that records what a protocol writes, and one request served into it through
the HTTP protocol the CLIs run (for tests of what reaches the socket, write by write)."""
from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.server import ServerState

from tracer.web.http_guard import guarded_protocol_class
from tracer.web.limits import ConnectionLimits


class RecordingTransport:
    """What a protocol wrote, one entry per system call (`writelines` is one `writev`)."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.closed = self.aborted = False
        self.wrote = asyncio.Event()   # set at each write; a test clears it to await the next

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))
        self.wrote.set()

    def writelines(self, parts) -> None:
        self.calls.append(b"".join(parts))
        self.wrote.set()

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def serve_request(app, request: bytes,
                        transport: RecordingTransport | None = None) -> list[bytes]:
    """One request through the guarded httptools protocol (as the CLIs run it) into a
    recording transport, on the running loop; the writes it made."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    protocol = guarded_protocol_class(ConnectionLimits())(config, ServerState(), {})
    transport = transport or RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(request)
    await asyncio.wait_for(asyncio.gather(*protocol.tasks), 10)
    protocol.connection_lost(None)
    return transport.calls
