"""The fake upstream's HTTP/1.1, raw over asyncio streams: a request read into a
`SeenRequest`, and a response written whole (`_send`, `_json`) or as one chunk of a chunked
body (`_chunk`).

Apart from the server (tracer/testing/fake_upstream.py) because this is the wire alone, the
same for every mode; the server decides what to answer. Written by hand rather than with an
HTTP library so the upstream is neither slow nor noisy, and a test controls each byte.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}


@dataclass(slots=True)
class SeenRequest:
    """One request as the fake upstream received it.

    >>> SeenRequest("GET", "/v1/models", {}, b"").path
    '/v1/models'
    """

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrival_epoch_ns: int = 0          # the head was read
    first_content_epoch_ns: int = 0    # the first content event was written


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _json(writer, status: int, obj: dict, extra_headers: bytes = b"") -> bool:
    return await _send(writer, status, b"application/json", json.dumps(obj).encode(),
                       extra_headers)


async def _send(writer, status: int, content_type: bytes, body: bytes,
                extra_headers: bytes = b"") -> bool:
    writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status, _REASONS.get(status, "").encode(), content_type, len(body), extra_headers, body))
    await writer.drain()
    return True


async def _read_request(reader: asyncio.StreamReader) -> SeenRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None   # the client closed an idle keep-alive connection
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    arrival_epoch_ns = time.time_ns()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return SeenRequest(method, target.split("?", 1)[0], headers, body, arrival_epoch_ns)
