"""Connection limits of a ttftscope front: header size, header and body read timeouts, a
connection cap (docs/reference.md, "Access, beacon tokens and connection limits").

Both fronts run under uvicorn with httptools, which bounds none of these: a client could
stream megabytes of unfinished headers (httptools buffers a header until it ends), hold a
connection open by sending one header byte at a time, or open connections until the process
runs out of descriptors, all before any ASGI code (the API key, the body limit) runs.
`tracer.web.http_guard.GuardedHttpToolsProtocol` is uvicorn's own httptools protocol with the missing checks added
around it, at the byte level:

- **head bytes** (request line + header fields) above `max_header_bytes` → 431 and close
  (RFC 6585 §5). The running count is checked after every read, so at most one read (uvloop
  reads up to 256 KiB) is held beyond the limit; the exact size is checked once the head is
  complete.
- **header timeout**: a connection that sends no complete head within `header_timeout_s` of
  its first byte (or of connecting) is closed, with a 408 when part of a request arrived
  (RFC 9110 §15.5.9). This is a deadline, not an idle timer, so trickling bytes do not reset
  it.
- **body timeout**: no body byte for `body_timeout_s` while the client owes some (and the app
  is reading) → 408 if the response has not started, then close; the app sees a disconnect.
- **connection cap**: a connection accepted while `max_connections` are already open gets a
  503 as soon as its head is read, and is closed; earlier connections are unaffected.
- **keep-alive**: an idle kept-alive connection closes after `keep_alive_timeout_s`
  (uvicorn's `timeout_keep_alive`).

Every refusal is an OpenAI-shaped JSON error with `Connection: close`. The checks cost one
counter update per read and, only for a head or body split over several reads, one timer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ConnectionLimits:
    """The defaults are documented in docs/reference.md and the CLI help.

    >>> ConnectionLimits().max_header_bytes
    32768
    """

    max_header_bytes: int = 32 * 1024   # nginx's default is 4 × 8 KiB buffers
    header_timeout_s: float = 20.0      # Apache mod_reqtimeout's first header deadline
    body_timeout_s: float = 30.0        # longest gap between two body reads
    max_connections: int = 1000         # under the common 1024-descriptor soft limit
    keep_alive_timeout_s: float = 5.0   # uvicorn's default

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1024 or self.max_connections < 1:
            raise ValueError("max_header_bytes >= 1024 and max_connections >= 1 are required")
        if min(self.header_timeout_s, self.body_timeout_s, self.keep_alive_timeout_s) <= 0:
            raise ValueError("timeouts must be > 0 s")

