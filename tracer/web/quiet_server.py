"""uvicorn's `Server`, woken once a second instead of ten times.

uvicorn's main loop sleeps 0.1 s at a time to refresh the `Date` header (once a second) and
to notice `should_exit`. On a small VM each timer's wake-up costs the loop 100-200 µs of CPU
(bench/wake_cost.py), so those ten wake-ups a second were most of an idle front's CPU, and at
a few requests a second a visible part of each request's (docs/figures.md,
"The proxy against nginx (AVX-512 machine, quiet)"). `QuietServer` sleeps a whole second
between ticks, and a request to exit (a signal, or code setting `should_exit` from any
thread) wakes it at once, so shutdown is as prompt as uvicorn's own.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn

TICK_S = 1.0   # the Date header's resolution: it is refreshed on every tick


def _nothing() -> None:
    return None


class QuietServer(uvicorn.Server):
    """`uvicorn.Server` with a one-second tick; everything else is uvicorn's."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._wake_main_loop: Callable[[], None] = _nothing
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self._wake_main_loop()

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # on_tick does its once-a-second work (the Date header, `callback_notify`) when
            # counter % 10 == 0, as it counts 0.1 s ticks: every tick here is a second.
            counter = (counter + 10) % 864_000
            await self._sleep_unless_exiting(loop)
            should_exit = await self.on_tick(counter)

    async def _sleep_unless_exiting(self, loop: asyncio.AbstractEventLoop) -> None:
        woken = loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        def wake_from_anywhere() -> None:
            # A signal handler or another thread: call_soon_threadsafe also wakes the
            # selector. The loop may have closed since this was read; nothing waits then.
            try:
                loop.call_soon_threadsafe(wake)
            except RuntimeError:
                pass

        timer = loop.call_later(TICK_S, wake)
        self._wake_main_loop = wake_from_anywhere
        try:
            if not self._should_exit:   # set before the wake-up was in place
                await woken
        finally:
            timer.cancel()
            self._wake_main_loop = _nothing
