"""Records made the way a front makes them: through the real composition root's tracer."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

import uvicorn

from tracer.record.stages import SERVER_STAGES
from tracer.web.observability import Observability

MODEL = "m"


def finish_request(obs: Observability, i: int, *, ttft_ms: float = 20.0,
                   prompt_tokens: int = 64, start_ns: int | None = None) -> str:
    """One request through `obs.tracer`, its nine stages contiguous, ended just now (or
    started at `start_ns`); its trace id."""
    step_ns = int(ttft_ms * 1e6) // len(SERVER_STAGES)
    start = time.perf_counter_ns() - len(SERVER_STAGES) * step_ns - 2_000_000 \
        if start_ns is None else start_ns
    active = obs.tracer.begin(request_id=f"req-{i}", model=MODEL, operation="chat",
                              traceparent=None, start_ns=start)
    for k, stage in enumerate(SERVER_STAGES, start=1):
        active.timeline.mark(stage, start + k * step_ns)
    active.timeline.emit(start + len(SERVER_STAGES) * step_ns)
    active.timeline.emit(start + len(SERVER_STAGES) * step_ns + 1_000_000)
    record = obs.tracer.finish(active, end_ns=start + len(SERVER_STAGES) * step_ns + 2_000_000,
                               finish_reason="stop", num_prompt_tokens=prompt_tokens,
                               num_output_tokens=2)
    return record.trace_id


@contextlib.contextmanager
def serving(app):
    """`app` on a loopback port (uvicorn in a thread); yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    started = threading.Event()

    async def run():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        started.set()
        await task
    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    assert started.wait(30) and server.started
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def wait_for(condition: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    """Poll `condition` until it holds or `timeout_s` passed; only for events that happen
    on another thread or process with nothing to wait on (each call site says which)."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        pause.wait(step_s)
