"""Response writes that belong together leave in one system call, as nginx's `writev` does.

ASGI gives an app no way to say "the next body message follows at once": uvicorn writes the
response head when the app sends `http.response.start`, and the end of a chunked body
(`0\\r\\n\\r\\n`) when it sends the last body message, each with a `write` of its own. A relay
often knows better. An upstream's first read usually holds its response head *and* its first
events, and its last read the last event and the end of the body: nginx sends each pair in
one `writev`, where the proxy made two writes, two wake-ups of the client, and on the first
token's path one more system call before the token (docs/reference.md, "Write batching").

The server offers it as the scope extension `WRITE_BATCH`, whose `hold` asks that the
app's next write wait for the one after it and leave with it. The held bytes are also
written at the end of the current turn of the event loop, so an app that holds and then
has nothing more to send delays nothing by more than a turn; closing the transport writes
them first.

    >>> class Transport:
    ...     def __init__(self): self.calls = []
    ...     def write(self, data): self.calls.append([data])
    ...     def writelines(self, parts): self.calls.append(list(parts))
    >>> class Loop:
    ...     def call_soon(self, callback): pass
    >>> inner = Transport()
    >>> batching = BatchingTransport(inner, Loop())
    >>> batching.hold(); batching.write(b"head"); inner.calls
    []
    >>> batching.write(b"body"); batching.write(b"more"); inner.calls
    [[b'head', b'body'], [b'more']]
"""
from __future__ import annotations

# The scope extension's name; its value is `{"hold": <callable>}`.
WRITE_BATCH = "ttftscope.write_batch"


def write_batch_hold(scope: dict):
    """The extension's `hold` when the server offers it, else None (e.g. on uvicorn's h11
    fallback): then every message is its own write, as before.

    >>> write_batch_hold({"extensions": {WRITE_BATCH: {"hold": print}}}) is print
    True
    >>> write_batch_hold({}) is None
    True
    """
    offered = (scope.get("extensions") or {}).get(WRITE_BATCH)
    return None if offered is None else offered["hold"]


class BatchingTransport:
    """A transport whose next write can be held and joined with the following one.

    Everything but `write`, `close` and `abort` is the wrapped transport's own.
    """

    __slots__ = ("_transport", "_loop", "_hold_next", "_held")

    def __init__(self, transport, loop) -> None:
        self._transport = transport
        self._loop = loop
        self._hold_next = False
        self._held: bytes | None = None

    def hold(self) -> None:
        """The next write waits for the one after it, or for the end of this loop turn."""
        if not self._hold_next and self._held is None:
            self._loop.call_soon(self.flush)
        self._hold_next = True

    def write(self, data: bytes) -> None:
        held, self._held = self._held, None
        if self._hold_next:
            self._hold_next = False
            self._held = data if held is None else held + data
        elif held is not None:
            self._transport.writelines((held, data))
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write what is held now (idempotent)."""
        self._hold_next = False
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._hold_next, self._held = False, None   # an abort drops what was unsent anyway
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)
