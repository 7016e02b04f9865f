"""Connection limits of a ttftscope front: header size, header and body read timeouts, a
whole-body deadline, a connection cap (docs/reference.md, "Access, beacon tokens and
connection limits").

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
  This is nginx's `client_body_timeout`, a gap between two reads: alone, one byte a second
  holds a connection forever.
- **body deadline**: the whole body must arrive within `body_deadline_s` of the head's end
  (the total nginx lacks; Envoy's `request_timeout`, Node's `requestTimeout`) → 408 and
  close, in the OTLP shape on `/v1/traces`. A check that finds the server itself not reading
  (the app's buffer full, or 100 Continue not sent yet) moves it to one gap later.
- **early answer**: a response that starts before its request's body has all arrived says
  `Connection: close` and the connection closes after it; the rest of the body is never
  read (a 401, a 413, a 415 has no use for it).
- **connection cap**: a connection accepted while `max_connections` are already open first
  reclaims an open connection that is stalled on its client (waiting on it for at least
  `reclaim_after_s` and sending under `min_rate_bytes_per_s`, Apache mod_reqtimeout's
  `MinRate`): an idle keep-alive connection is closed, a trickled head or body gets 408.
  With none stalled (every connection is a request the server is working on, or one that
  makes progress), the newcomer gets a 503 once its head is read, and is closed.
  docs/reference.md, "Access, beacon tokens and connection limits" says why this rather
  than a cap per client address.
- **keep-alive**: an idle kept-alive connection closes after `keep_alive_timeout_s`
  (uvicorn's `timeout_keep_alive`).

Every refusal is an OpenAI-shaped JSON error (on `/v1/traces`, once its head is read,
OTLP's google.rpc.Status) with `Connection: close`. The checks cost one
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
    # The largest body we take (4 MiB, an OTLP export) in 60 s is 70 KB/s.
    body_deadline_s: float = 60.0       # whole body, from the head's end
    max_connections: int = 1000         # under the common 1024-descriptor soft limit
    keep_alive_timeout_s: float = 5.0   # uvicorn's default
    # At the cap, a connection waiting on its client this long at under this rate is
    # reclaimed; a fresh one has had no time to send yet.
    reclaim_after_s: float = 1.0
    min_rate_bytes_per_s: float = 500.0   # Apache mod_reqtimeout's default MinRate

    def __post_init__(self) -> None:
        if self.max_header_bytes < 1024 or self.max_connections < 1:
            raise ValueError("max_header_bytes >= 1024 and max_connections >= 1 are required")
        if min(self.header_timeout_s, self.body_timeout_s, self.body_deadline_s,
               self.keep_alive_timeout_s) <= 0:
            raise ValueError("timeouts must be > 0 s")
        if self.reclaim_after_s < 0 or self.min_rate_bytes_per_s < 0:
            raise ValueError("reclaim_after_s and min_rate_bytes_per_s must be >= 0")

