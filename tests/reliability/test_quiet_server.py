"""`QuietServer` (tracer/web/quiet_server.py), the uvicorn server every front runs: it ticks
once a `TICK_S`, refreshing the Date header on every tick, and a request to exit wakes it at
once, from another thread or from a signal. The tick is made an hour long where the test is
that something else than the tick ended the wait: a lost wake-up fails at the test's bound
instead of passing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from reliability_support import serve

from tracer.web import quiet_server
from tracer.web.quiet_server import QuietServer

REPO = Path(__file__).resolve().parents[2]


async def _app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
    elif scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def test_should_exit_set_from_another_thread_wakes_an_hour_long_tick(monkeypatch):
    monkeypatch.setattr(quiet_server, "TICK_S", 3600.0)
    served = serve(_app)
    assert httpx.get(served.base_url).text == "ok"
    served.stop()
    assert not served.thread.is_alive(), "the main loop slept through should_exit"


def test_every_tick_refreshes_the_date_header(monkeypatch):
    monkeypatch.setattr(quiet_server, "TICK_S", 0.01)
    ticks: list[int] = []
    original = QuietServer.on_tick

    async def counting_on_tick(self, counter):
        headers = self.server_state.default_headers
        result = await original(self, counter)
        ticks.append(counter)
        assert self.server_state.default_headers is not headers   # rebuilt on this tick
        if len(ticks) >= 5:
            self.should_exit = True
        return result

    monkeypatch.setattr(QuietServer, "on_tick", counting_on_tick)
    served = serve(_app)
    served.thread.join(timeout=30)
    assert not served.thread.is_alive()
    assert ticks[:5] == [0, 10, 20, 30, 40]
    assert any(name == b"date" for name, _ in served.server.server_state.default_headers)


_SIGNALLED = """
import signal
import uvicorn
from tracer.web import quiet_server

async def app(scope, receive, send):
    pass

class Announcing(quiet_server.QuietServer):
    async def startup(self, sockets=None):
        await super().startup(sockets)
        print("started", flush=True)

quiet_server.TICK_S = 3600.0
# uvicorn re-raises a signal it caught once it has shut down: this handler then says so.
signal.signal(signal.SIGTERM, lambda *_: print("shut down", flush=True))
Announcing(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                          log_level="warning")).run()
"""


def test_a_signal_wakes_an_hour_long_tick_and_the_server_shuts_down():
    process = subprocess.Popen([sys.executable, "-c", _SIGNALLED], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "started"
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert out.strip() == "shut down" and process.returncode == 0
