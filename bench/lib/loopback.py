"""Ports and start-up waits for the processes the benchmarks run on 127.0.0.1."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen | None, timeout_s: float = 60) -> None:
    """Return once 127.0.0.1:`port` accepts; raise if `process` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # polling a starting process; not a test
    raise TimeoutError(f"nothing listens on {port} after {timeout_s}s")


def start_listening(argv_for: Callable[[int], list[str]], log: Path, *, attempts: int = 3,
                    timeout_s: float = 60, **popen) -> tuple[int, subprocess.Popen]:
    """Start `argv_for(port)` on a free port and wait until it accepts; its stderr goes to
    `log`, whose tail a failure quotes.

    A port free when chosen can be taken before the child binds it (another process's
    outgoing connection gets it as its ephemeral port), so a child that exits before it
    listens is started again on another port, `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        with open(log, "ab") as err:
            proc = subprocess.Popen(argv_for(port), stdout=subprocess.DEVNULL, stderr=err, **popen)
        try:
            wait_listening(port, proc, timeout_s)
            return port, proc
        except RuntimeError:       # it exited before it listened
            if attempt == attempts:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{argv_for(port)[:4]} never listened; its stderr:\n{tail}")
        except BaseException:
            proc.kill()
            raise
    raise ValueError(f"attempts must be at least 1, got {attempts}")


def wait_child_pid(process: subprocess.Popen, timeout_s: float = 60) -> int:
    """The pid of `process`'s first child, once it has one.

    nginx's master opens the listening socket before it forks its worker, so a port that
    accepts (the kernel queues the connection) does not yet mean a worker exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process {process.pid} exited with {process.returncode}")
        children = psutil.Process(process.pid).children()
        if children:
            return children[0].pid
        time.sleep(0.01)  # polling a starting process; not a test
    raise TimeoutError(f"process {process.pid} has no child after {timeout_s}s")
