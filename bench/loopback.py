"""Ports and start-up waits for the processes the benchmarks run on 127.0.0.1."""
from __future__ import annotations

import socket
import subprocess
import time


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
