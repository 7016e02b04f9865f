"""bench/proxy_threads.py at a tiny size, and the kernel names it tells the tracer's threads
apart by (tracer/core/thread_name.py)."""
from __future__ import annotations

import os
import pathlib
import re
import sys
import threading

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from bench_script import run_bench_script  # noqa: E402

from tracer.core.record_worker import OS_THREAD_NAME as WORKER_THREAD, RecordWorker  # noqa: E402
from tracer.core.thread_name import MAX_NAME_BYTES, name_this_thread  # noqa: E402
from tracer.store.writer import OS_THREAD_NAME as STORE_THREAD  # noqa: E402


def kernel_name(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as f:
        return f.read().strip()


def test_a_thread_is_named_in_the_kernels_task_list_and_the_name_is_cut_to_fit():
    names = {}

    def run(name: str) -> None:
        assert name_this_thread(name)
        names[name] = kernel_name(threading.get_native_id())

    for name in ("ttft-x", "a-name-longer-than-fifteen-bytes"):
        thread = threading.Thread(target=run, args=(name,))
        thread.start()
        thread.join()
    assert names == {"ttft-x": "ttft-x",
                     "a-name-longer-than-fifteen-bytes": "a-name-longer-than-fifteen-bytes"[
                         :MAX_NAME_BYTES]}
    assert kernel_name(threading.get_native_id()) != "ttft-x"   # only the calling thread


def test_the_record_worker_names_its_thread():
    class Sink:
        def publish(self, record):
            pass

    worker = RecordWorker([Sink()], on_failure=lambda sink, exc: None)
    try:
        worker.submit(object())
        assert worker.flush(10)
        assert kernel_name(worker._thread.native_id) == WORKER_THREAD
    finally:
        assert worker.close(10)


def test_the_bench_splits_the_proxys_cpu_by_thread():
    # One round of short streams; the record worker lingers 1 s before its first trip and
    # the store writes after it, so their CPU falls in the idle window (2 s).
    out = run_bench_script("proxy_threads.py", "--chunks", "4", "--requests", "16",
                           "--concurrency", "4", "--rounds", "1", "--idle-s", "2",
                           timeout_s=180)
    assert "(16 completed, 0 failed)" in out, out
    rows = {m[1]: (float(m[2]), float(m[3]), float(m[4])) for m in re.finditer(
        r"^\s+(event loop|ttft-records|ttft-store|other threads)\s+([\d.]+)\s+([\d.]+)\s+"
        r"([\d.]+)$", out, re.M)}
    assert set(rows) == {"event loop", WORKER_THREAD, STORE_THREAD, "other threads"}, out
    loop_us, loop_wakes, _ = rows["event loop"]
    assert loop_us > 0 and loop_wakes > 0, out
    for thread in (WORKER_THREAD, STORE_THREAD):   # each published or wrote, loaded or idle
        assert rows[thread][0] + rows[thread][2] > 0, out
    total = float(re.search(r"^\s+all\s+([\d.]+)$", out, re.M)[1])
    assert abs(total - sum(r[0] for r in rows.values())) < 0.5, out
