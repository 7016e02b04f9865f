"""Keep the CPU's OpenMP work on one thread: the engine's step thread.

torch's CPU build uses GNU OpenMP. Every thread that runs a parallel region becomes the master
of its own pool of worker threads, and once libgomp manages more threads than there are CPUs
it stops spinning between regions and parks its workers in the kernel instead. A decode step is
~300 small parallel regions, so each then pays a wake-up: measured here, a decode step on the
step thread took 25 ms after the main thread had loaded the model, and 10 ms when the load ran
on a thread that had exited (its pool goes with it) (docs/reference.md, "Engine weight formats").
So the heavy set-up runs on a short-lived thread, and the only long-lived OpenMP master is
whichever thread steps the engine.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_short_lived_thread(fn: Callable[[], T]) -> T:
    """fn() on a new thread that exits afterwards; its result, or its exception re-raised.

    >>> on_short_lived_thread(lambda: threading.current_thread() is threading.main_thread())
    False
    """
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as is
            error.append(exc)

    thread = threading.Thread(target=run, name="engine-setup")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
