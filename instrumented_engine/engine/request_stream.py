"""One admitted request's outputs on their way to its reader, in a bounded queue.

A reader that falls `max_pending_outputs` behind (a client still connected but not reading,
whose socket buffers are full) has its request aborted, its KV blocks freed, and reads
`SlowReaderError` after what was already queued (docs/architecture.md, "Through the engine").
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from instrumented_engine.engine.errors import SlowReaderError
from instrumented_engine.engine.outputs import RequestOutput

# Outputs (one a step) a request may hold unread before it is aborted as a slow reader. They
# pile up only once the socket buffers are full (~1.7 MB, ~10k events, on loopback): not a
# network hiccup. ~300 B an output: ~80 KB a request; at 100 tokens/s, 2.5 s more of stall.
MAX_PENDING_OUTPUTS = 256


class _Aborts(Protocol):
    """What a stream needs of its engine (`AsyncEngine`)."""

    def abort(self, request_id: str) -> bool: ...
    def abort_slow_reader(self, request_id: str) -> None: ...


class RequestStream:
    """The outputs of one admitted request. Closing it early (client gone) aborts the request.

    Not a doctest (it needs a running event loop and a loaded model); inside a coroutine::

        stream = await aengine.submit("r1", prompt="Hello", sampling=SamplingParams(max_tokens=8))
        async for out in stream:         # one RequestOutput per step; out.text may be ''
            print(out.text, end="")
        # the last out has finished=True and a finish_reason
    """

    def __init__(self, engine: _Aborts, request_id: str, num_prompt_tokens: int,
                 max_pending_outputs: int = MAX_PENDING_OUTPUTS) -> None:
        self._engine = engine
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_cached_tokens = 0
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._max_pending = max_pending_outputs
        self.finished = False
        self.slow_reader = False  # outgrew its bound: aborted in the engine
        # Called then, on the event loop: the reader is stuck in a write, which whoever owns
        # the connection must stop for the request to end.
        self.on_slow_reader: Callable[[], None] | None = None

    def _put(self, item: RequestOutput | BaseException) -> None:
        if self.slow_reader:
            return
        if self._queue.qsize() >= self._max_pending:
            self.slow_reader = True
            self._engine.abort_slow_reader(self.request_id)
            self._queue.put_nowait(SlowReaderError(
                f"the reader fell {self._max_pending} outputs behind; request aborted"))
            if self.on_slow_reader is not None:
                self.on_slow_reader()
            return
        self._queue.put_nowait(item)

    @property
    def num_pending(self) -> int:
        """Outputs queued and not read yet."""
        return self._queue.qsize()

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            if not self.finished:
                self.abort()

    def abort(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)
