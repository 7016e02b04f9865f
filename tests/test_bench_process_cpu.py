"""bench/lib/process_cpu.py against psutil, the library the benches read CPU with: the same
time at psutil's 10 ms resolution, threads that already exited included, and finer than a
tick."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from bench.lib.process_cpu import process_cpu_s

# The child burns CPU in a thread that then exits, then in its main thread, and waits.
CHILD = """
import sys, threading, time
def burn(s):
    end = time.thread_time() + s
    while time.thread_time() < end:
        pass
t = threading.Thread(target=burn, args=(0.2,)); t.start(); t.join()
burn(0.1)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_it_reads_what_psutil_reads_exited_threads_included():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        ours = process_cpu_s(child.pid)
        theirs = sum(psutil.Process(child.pid).cpu_times()[:2])
        assert ours >= 0.3                     # both threads' burns, the exited one's too
        assert abs(ours - theirs) < 0.03, (ours, theirs)   # three of psutil's ticks
    finally:
        child.communicate("\n", timeout=30)


def test_it_sees_less_than_a_tick():
    before = process_cpu_s(os.getpid())
    end = time.thread_time() + 0.002
    while time.thread_time() < end:
        pass
    # 2 ms of this thread's CPU: a reading in psutil's 10 ms ticks would most often be 0.
    assert process_cpu_s(os.getpid()) - before >= 0.002
