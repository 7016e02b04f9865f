"""Another process's CPU time in nanoseconds: all its threads', the exited ones included.

psutil's CPU times (and /proc/PID/stat) count in clock ticks of 10 ms, so a short bench batch
on a fast CPU can read 0 (a proxy's 24 tiny streams did). The kernel also keeps each
process's scheduler runtime in ns, on the clock `clock_getcpuclockid(3)` names; `clock_gettime`
reads it for any process this one can see. It is user and system time together.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.clock_getcpuclockid.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_int))


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process `pid` (user + system, every thread it has had).

    >>> 0 < process_cpu_s(os.getpid()) < time.process_time() + 1
    True
    """
    clock = ctypes.c_int()
    err = _libc.clock_getcpuclockid(pid, ctypes.byref(clock))
    if err:
        raise OSError(err, f"clock_getcpuclockid({pid}): {os.strerror(err)}")
    return time.clock_gettime_ns(clock.value) / 1e9
