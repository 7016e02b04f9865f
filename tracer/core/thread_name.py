"""The kernel's name for the calling thread: what `/proc/PID/task/TID/comm`, `top -H` and
`ps -L` show, so that each of the tracer's threads can be told apart, and its CPU read, from
outside the process (bench/proxy_threads.py). Python 3.11 names its `Thread` objects only
for itself: to the kernel every thread is called after the process (`python`).

Linux only (`prctl(PR_SET_NAME)`); elsewhere, or when the C library cannot be loaded, it
does nothing and says so.
"""
from __future__ import annotations

import ctypes
import sys

# The kernel keeps 16 bytes, the terminating NUL included (TASK_COMM_LEN).
MAX_NAME_BYTES = 15
_PR_SET_NAME = 15


def name_this_thread(name: str) -> bool:
    """Give the calling thread `name` (ASCII, cut to MAX_NAME_BYTES) in the kernel's task
    list; True when it took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        encoded = name.encode("ascii", "replace")[:MAX_NAME_BYTES]
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0) == 0
    except (OSError, AttributeError):   # no C library or no prctl: only the name is lost
        return False
