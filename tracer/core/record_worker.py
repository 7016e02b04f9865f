"""The background thread that publishes finished records to the costly sinks.

Run on the finishing thread (the event loop), the costly sinks would take ~200 µs a
request from it: the spans and their OTLP encoding, the exemplar metrics, the log line
(docs/reference.md, "Costs"). A `RequestRecord` is complete once `finish` has built it, so
that work can run later, elsewhere: the finishing thread appends the record here and
returns, and one thread publishes the records to its sinks in the order they were submitted.

Three promises, each with a test in tests/tracer/test_record_worker.py:

- **Nothing is lost or reordered.** One FIFO, one consumer: every sink sees the records in
  submission order. The queue is bounded, and a full queue makes `submit` *wait* (back
  pressure on the finishing thread) instead of dropping: a lost record would be a missing
  span, a metric that undercounts, a log line that never comes, which is the one thing a
  tracer must not do. Waiting only happens when the sinks cannot keep up for
  `max_pending` records, and it is counted (`num_blocked`).
- **Read your writes.** `flush()` returns once every record submitted before the call has
  reached every sink; readers (`/metrics`, tests) call it instead of sleeping.
- **A sink that raises costs only itself.** Its failure is reported to `on_failure` (the
  tracer's `sink_failures`), the other sinks still get the record, and the thread goes on.

The thread starts on the first record and `close()` drains and stops it; a record submitted
after `close` starts a new one (a server's lifespan can run twice in one process). When no
thread can be started (interpreter shutdown), the caller publishes the record itself: late,
on the wrong thread, but not lost.

It is the same GIL: the worker's CPU (`cpu_ns`) is not gone, it only leaves the request's
path. bench/tracer_cost.py reports both figures.
"""
from __future__ import annotations

import atexit
import collections
import threading
import time
from collections.abc import Callable, Sequence

from tracer.core.sink import batch_methods
from tracer.core.thread_name import name_this_thread


# Records waiting or being published before `submit` waits. At ~150 µs of worker CPU per
# record that is ~0.6 s of backlog: long enough to ride out a burst, short enough to bound
# the memory (a record is a few kB) and the time `flush` may take.
DEFAULT_MAX_PENDING = 4096
# Records taken per trip through the lock: fewer lock round trips, while `flush` and
# waiting submitters still hear back every few milliseconds.
_BATCH = 64
# From this many records a batch goes sink by sink, through the sinks' batch methods
# (`collect`, then one `flush_batch`: tracer/core/sink.py); a smaller one record by record,
# through `publish`. Grouping pays once a batch repeats a histogram's buckets: the metrics
# cost about the same at 2 records a batch, 0.7x at 4 and 0.5x at 64; sink by sink, the
# worker's CPU per record fell ~0.83x at 64 (docs/figures.md, "The tracer's own cost").
# Batches grow with the load (the linger below), so the saving comes when it is needed.
MIN_SINK_BATCH = 4
# How long a record may wait for others to share the worker's trip to the sinks. `flush` and
# a full batch wake the worker at once, so readers (/metrics, /ui) never wait for it; the
# log line, the spans' hand-off to their exporter (which batches 5 s anyway) and the store's
# write see a record up to this much later. Records published one at a time run cold: at
# 6 requests a second through the proxy (bench/proxy_overhead.py's 66-event streams) the
# worker spent 1.1 ms of CPU a record lingering 0.05 s, 0.79 at 0.25 s, 0.54 at 0.5 s and
# 0.38 at 1 s, where a warm batch costs ~0.25 ms (bench/tracer_cost.py). Every trip also
# costs a timer's expiry and a notified wake-up, ~120 and ~35 µs of the thread's CPU on a
# 2-vCPU VM (bench/wake_cost.py); waking per record made GIL hand-offs the largest count
# of system calls in the proxy (`strace -c`). The figures:
# docs/figures.md, "The proxy against nginx (AVX-512 machine, quiet)".
LINGER_S = 1.0
# The GIL hand-off between records (`time.sleep(0)`: it releases the GIL around a system
# call, so a thread waiting for it, the event loop, runs now rather than after the 5 ms
# switch interval) happens once this much of the worker's time has passed since the last
# one, not after every record: each costs ~14 µs of CPU on a 2-vCPU VM (clock_nanosleep),
# as much as a tenth of a record. A waiting loop then gets the GIL within this plus one
# record instead of one record (bench/gil_handoff.py; docs/figures.md, "The tracer's own
# cost"). `os.sched_yield` is cheaper still (~0.6 µs) but under CPU contention its hand-off
# sometimes fails and a loop waited up to the switch interval (p99 3-30 ms against 4 ms).
YIELD_EVERY_NS = 200_000
# The worker thread's name in the kernel's task list (tracer/core/thread_name.py).
OS_THREAD_NAME = "ttft-records"
# How long the exit hook waits for the backlog (a sink stuck on a dead collector must not
# hold the process forever).
_EXIT_DRAIN_S = 10.0


class RecordWorker:
    """Publishes submitted records to `sinks`, in order, on one daemon thread.

    >>> seen = []
    >>> class Sink:
    ...     def publish(self, record): seen.append(record)
    >>> worker = RecordWorker([Sink()], on_failure=lambda sink, exc: None)
    >>> for i in range(3):
    ...     worker.submit(i)
    >>> worker.flush(timeout_s=10), seen
    (True, [0, 1, 2])
    >>> worker.close()
    True
    """

    def __init__(self, sinks: Sequence[object], *,
                 on_failure: Callable[[object, BaseException], None],
                 on_published: Callable[[int], None] | None = None,
                 max_pending: int = DEFAULT_MAX_PENDING, linger_s: float = LINGER_S,
                 name: str = "ttftscope-records") -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.sinks = tuple(sinks)
        self.max_pending = max_pending
        self.linger_s = linger_s
        self._full_batch = min(_BATCH, max_pending)   # a queue this long ends a linger
        self.name = name
        self._on_failure = on_failure
        self._on_published = on_published
        self._queue: collections.deque = collections.deque()
        lock = threading.Lock()
        self._lock = lock
        self._has_work = threading.Condition(lock)
        self._has_room = threading.Condition(lock)
        self._progress = threading.Condition(lock)   # `_published` moved
        self._submitted = 0      # records ever submitted
        self._published = 0      # records that have been through every sink
        self._thread: threading.Thread | None = None
        self._idle = False       # the thread waits on `_has_work`: only then notify it
        self._stop = False
        self._waiting_submitters = 0
        self._flushing = 0
        self.num_blocked = 0     # submits that had to wait for room (back pressure)
        self.cpu_ns = 0          # CPU time the worker thread spent publishing
        self._atexit_registered = False

    # --- the finishing thread -------------------------------------------------------------

    def submit(self, record: object) -> None:
        """Queue `record` for the sinks; waits while `max_pending` records are pending."""
        with self._lock:
            if (self._submitted - self._published >= self.max_pending
                    and self._thread is not None):
                self.num_blocked += 1
                self._waiting_submitters += 1
                self._has_work.notify()   # a lingering worker publishes now
                try:
                    # Back pressure, never a drop (see the module docstring).
                    while (self._submitted - self._published >= self.max_pending
                           and self._thread is not None):
                        self._has_room.wait()
                finally:
                    self._waiting_submitters -= 1
            thread = self._thread
            if thread is None or self._stop:
                thread = self._start_locked()
            if thread is not None:
                queue = self._queue
                queue.append(record)
                self._submitted += 1
                # Wake an idle worker for the first record (it then lingers for more) and
                # for a full batch; the records in between ride along.
                if self._idle and (len(queue) == 1 or len(queue) >= self._full_batch):
                    self._has_work.notify()
                return
        # No thread could be started (the interpreter is shutting down): publish here.
        self._publish_batch([record])
        if self._on_published is not None:
            self._on_published(1)

    def _start_locked(self) -> threading.Thread | None:
        while self._stop and self._thread is not None:
            # close() told the thread to stop: let it publish what it holds first.
            old = self._thread
            self._lock.release()
            try:
                old.join()
            finally:
                self._lock.acquire()
            if self._thread is old:
                self._thread = None
        if self._thread is not None:
            return self._thread   # another submitter started it while we waited
        self._stop = False
        thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        try:
            thread.start()
        except RuntimeError:   # "can't create new thread at interpreter shutdown"
            return None
        self._thread = thread
        if not self._atexit_registered:
            # A daemon thread dies unannounced at exit: drain first. atexit runs handlers
            # last-registered first, so this runs before the OTel provider's own shutdown
            # (registered when the provider was made, before the worker's first record).
            atexit.register(self.close, _EXIT_DRAIN_S)
            self._atexit_registered = True
        return thread

    # --- readers --------------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record submitted before this call has reached every sink.

        True when it did; False on timeout. Called from a sink (on the worker thread) it
        cannot wait for itself and returns False at once.
        """
        if threading.current_thread() is self._thread:
            return False
        with self._lock:
            target = self._submitted
            if self._published >= target:
                return True
            if self._thread is None:
                return False   # nothing will publish what is pending
            self._flushing += 1
            self._has_work.notify()   # a lingering worker publishes now
            try:
                # Also wakes when the thread died: nothing would publish the rest.
                self._progress.wait_for(
                    lambda: self._published >= target or self._thread is None, timeout_s)
                return self._published >= target
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> bool:
        """Publish everything pending, then stop the thread. True when it drained in time."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return True
            self._stop = True
            self._has_work.notify()
        if thread is threading.current_thread():
            return False
        thread.join(timeout_s)
        return not thread.is_alive()

    @property
    def is_running(self) -> bool:
        """Whether the worker thread is alive (it starts on the first record)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def is_closing(self) -> bool:
        """Whether `close` was called and the thread has not been started again since."""
        return self._stop

    @property
    def num_pending(self) -> int:
        """Records submitted and not yet through every sink."""
        return self._submitted - self._published

    @property
    def num_published(self) -> int:
        return self._published

    @property
    def num_waiting_submitters(self) -> int:
        """Threads waiting in `submit` for room right now (back pressure)."""
        return self._waiting_submitters

    @property
    def num_flushing(self) -> int:
        """Threads waiting in `flush` right now."""
        return self._flushing

    # --- the worker thread ----------------------------------------------------------------

    def _run(self) -> None:
        name_this_thread(OS_THREAD_NAME)
        try:
            self._loop()
        finally:
            with self._lock:
                if self._thread is threading.current_thread() and not self._stop:
                    # Died of something a sink let through (SystemExit in a sink): the next
                    # submit starts a new thread, and nobody waits on this one.
                    self._thread = None
                self._has_room.notify_all()
                self._progress.notify_all()

    def _loop(self) -> None:
        lock, queue, thread_time_ns = self._lock, self._queue, time.thread_time_ns
        last_yield_ns = 0
        while True:
            with lock:
                while not queue:
                    if self._stop:
                        return
                    self._idle = True
                    self._has_work.wait()
                    self._idle = False
                if (self.linger_s > 0 and len(queue) < _BATCH and not self._stop
                        and not self._flushing and not self._waiting_submitters):
                    self._idle = True
                    self._has_work.wait(self.linger_s)   # more records share this trip
                    self._idle = False
                batch = [queue.popleft() for _ in range(min(len(queue), _BATCH))]
            start_ns = thread_time_ns()
            try:
                last_yield_ns = self._publish_batch(batch, last_yield_ns)
            finally:
                self.cpu_ns += thread_time_ns() - start_ns
                if self._on_published is not None:
                    self._on_published(len(batch))
                with lock:
                    self._published += len(batch)
                    if self._waiting_submitters:
                        self._has_room.notify(len(batch))
                    if self._flushing:
                        self._progress.notify_all()

    def _publish_batch(self, batch: list, last_yield_ns: int = 0) -> int:
        """Every record of `batch` to every sink: record by record below MIN_SINK_BATCH,
        else sink by sink, each `BatchSink` ending with its `flush_batch`
        (tracer/core/sink.py). Returns when the GIL was last handed over."""
        on_failure = self._on_failure
        if len(batch) < MIN_SINK_BATCH:
            for i, record in enumerate(batch):
                if i:   # between records: after the last one the worker waits, GIL released
                    last_yield_ns = self._hand_over(last_yield_ns)
                for sink in self.sinks:
                    try:
                        sink.publish(record)
                    except Exception as exc:   # noqa: BLE001 — counted; tracing never stops
                        on_failure(sink, exc)
            return last_yield_ns
        # A batch goes sink by sink: each sink's code and state (the diagnosis' baselines,
        # the metrics' children) stay in the CPU's caches over the whole batch, rather than
        # being pushed out by five other sinks between two records. Each sink still sees
        # every record in order, after every sink before it.
        for sink in self.sinks:
            publish, flush_batch = batch_methods(sink)
            for record in batch:
                try:
                    publish(record)
                except Exception as exc:   # noqa: BLE001 — counted; tracing never stops
                    on_failure(sink, exc)
                last_yield_ns = self._hand_over(last_yield_ns)
            if flush_batch is not None:
                try:
                    flush_batch()
                except Exception as exc:   # noqa: BLE001 — counted; tracing never stops
                    on_failure(sink, exc)
        return last_yield_ns

    @staticmethod
    def _hand_over(last_yield_ns: int) -> int:
        """Hand the GIL over: an event loop waiting for it runs now, not after the 5 ms
        switch interval (a TTFT spike for every request relayed meanwhile); at most every
        YIELD_EVERY_NS. Returns when it was last handed over."""
        now_ns = time.perf_counter_ns()
        if now_ns - last_yield_ns >= YIELD_EVERY_NS:
            time.sleep(0)
            return time.perf_counter_ns()
        return last_yield_ns
