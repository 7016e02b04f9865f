"""The store's writer: records reach the database in batches from one thread, through a
bounded queue, and never from a request's thread.

- `submit` appends and returns (the tracer's worker calls it); past `max_pending` records
  waiting, a record is dropped and counted (`dropped["queue_full"]`) rather than let a slow
  database grow memory without bound or stall the tracer.
- The thread writes what is waiting `flush_interval_s` after the first of it came, or at
  once past `batch_size`: a finished record is in the store within `flush_interval_s` plus
  one write (the tracer's worker adds at most its linger before that; docs/architecture.md,
  "The store"). With nothing waiting it sleeps until a record comes: no timer wakes it.
- A failed write keeps its batch and tries again after a back-off (up to `MAX_BACKOFF_S`),
  reconnecting; meanwhile new records queue up to the bound. So a database that is down,
  slow or full costs records only once the bound is reached, each one counted, and writing
  resumes by itself when it is back. Failures are logged once per `LOG_INTERVAL_S` with the
  count since the last line, not once per record.
- Every `retention_interval_s` the thread deletes what retention no longer keeps and
  measures the store (size, oldest record) for the gauges.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tracer.core.thread_name import name_this_thread
from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord
from tracer.store.codec import encode
from tracer.store.sql import SqlStore, key_text

log = logging.getLogger("ttftscope.store")

DEFAULT_MAX_PENDING = 20_000
DEFAULT_BATCH_SIZE = 500
DEFAULT_FLUSH_INTERVAL_S = 0.2
DEFAULT_RETENTION_INTERVAL_S = 30.0
MAX_BACKOFF_S = 5.0
LOG_INTERVAL_S = 10.0
DROP_REASONS = ("queue_full", "write_failed", "encode_failed")
# The writer thread's name in the kernel's task list (tracer/core/thread_name.py).
OS_THREAD_NAME = "ttft-store"


# Retention's defaults: a week of history (a deploy's before and after, last week's
# incident), in at most 2 GiB: ~380,000 records at ~5.6 kB each in SQLite (docs/figures.md,
# "The record store"), a week at 0.6 requests/s, 2 hours at 54. Whichever bound comes first
# holds; a busy machine raises the size (--retention-max-mb) or points at PostgreSQL.
DEFAULT_MAX_AGE_S = 7 * 24 * 3600.0
DEFAULT_MAX_BYTES = 2 * 1024**3


@dataclass(frozen=True, slots=True)
class Retention:
    """What the store keeps: records younger than `max_age_s`, in at most `max_bytes`."""

    max_age_s: float = DEFAULT_MAX_AGE_S
    max_bytes: int | None = DEFAULT_MAX_BYTES


@dataclass(slots=True)
class WriterStats:
    written: int = 0
    failed_writes: int = 0
    dropped: dict = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    trimmed: int = 0
    size_bytes: int | None = None
    oldest_end_unix_ns: int | None = None
    up: bool = True            # the last write or trim succeeded


@dataclass(frozen=True, slots=True)
class Change:
    """A change to a stored record this process no longer holds (a late engine span for
    an old request), applied on the writer's thread, which may read the database."""

    request_id: str
    change: Callable[[RequestRecord], RequestRecord]


class _DatabaseError(Exception):
    """A `Change`'s read failed: the batch is retried like a failed write."""


class StoreWriter:
    """See the module docstring."""

    def __init__(self, sql: SqlStore, clock: Clock, *, retention: Retention = Retention(),
                 max_pending: int = DEFAULT_MAX_PENDING, batch_size: int = DEFAULT_BATCH_SIZE,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
                 retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S) -> None:
        self.sql = sql
        self.clock = clock
        self.retention = retention
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.retention_interval_s = retention_interval_s
        self.stats = WriterStats()
        # The state to write of a submitted record: the store's current copy (a late span
        # may have replaced the object since it was submitted); the record itself by default.
        self.current = lambda record: record
        # How a `Change` finds its stored record (the PersistentStore reads the database).
        self.load: Callable[[str], RequestRecord | None] = lambda request_id: None
        self._queue: deque = deque()    # RequestRecord | Change
        self._retry: list = []
        self._cond = threading.Condition()
        self._submitted = 0       # records ever submitted
        self._done = 0            # records written or dropped
        self._closing = False
        self._flush_requested = False
        self._idle = False        # the thread sleeps with nothing to write: `submit` wakes it
        self._thread: threading.Thread | None = None
        self._backoff_s = 0.0
        self._next_trim = 0.0
        self._unlogged_drops = 0
        self._last_log = 0.0
        self._last_error = ""

    # -- the producer's side --------------------------------------------------------------

    def submit(self, record: RequestRecord) -> bool:
        """Queue `record` for writing (again, if it changed); False when it was dropped."""
        with self._cond:
            self._submitted += 1
            if len(self._queue) + len(self._retry) >= self.max_pending:
                self._drop_locked("queue_full", 1)
                return False
            self._queue.append(record)
            if self._thread is None:
                self._start_locked()
            if self._idle or len(self._queue) >= self.batch_size:
                self._cond.notify_all()
        return True

    publish = submit    # as the tracer's deferred sink

    def submit_change(self, request_id: str,
                      change: Callable[[RequestRecord], RequestRecord]) -> bool:
        """Queue `change` for the stored record of `request_id`: read, changed and written
        again on this thread (`load` reads it), never on the caller's. False when dropped."""
        return self.submit(Change(request_id, change))

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._retry)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """True once every record submitted before the call is written or dropped."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._submitted
            self._flush_requested = True
            self._cond.notify_all()
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return self._done >= target
                self._cond.wait(min(left, 0.05))
            return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Writes what is waiting (within `timeout_s`) and stops the thread."""
        flushed = self.flush(timeout_s)
        with self._cond:
            self._closing = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout_s)
        self.sql.close()
        return flushed

    def start(self) -> None:
        """Starts the thread now (it also starts on the first record): the retention and
        the gauges then run on an idle store too."""
        with self._cond:
            if self._thread is None:
                self._start_locked()

    def _start_locked(self) -> None:
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="ttftscope-store", daemon=True)
        self._thread.start()

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        name_this_thread(OS_THREAD_NAME)
        while True:
            with self._cond:
                if self._closing:
                    return
                if not (self._queue or self._retry or self._backoff_s or self._flush_requested):
                    # Nothing waits: sleep until `submit` wakes us or a trim or a log line is
                    # due. No timer wakes an idle writer: a timer's expiry costs ~0.1 ms of
                    # the thread's CPU on a 2-vCPU VM (bench/wake_cost.py), five a second.
                    self._idle = True
                    self._cond.wait(self._idle_wait_s())
                    self._idle = False
                if self._backoff_s or ((self._queue or self._retry) and not self._flush_requested
                                       and len(self._queue) < self.batch_size):
                    self._cond.wait(self._backoff_s or self.flush_interval_s)
                self._flush_requested = False
                if self._closing and not self._queue and not self._retry:
                    return
                batch = self._retry
                self._retry = []
                while self._queue and len(batch) < self.batch_size:
                    batch.append(self._queue.popleft())
            if batch:
                self._write(batch)
            if time.monotonic() >= self._next_trim:
                self._trim()
            self._log_drops()

    def _idle_wait_s(self) -> float:
        """How long an idle thread may sleep: until the next trim, or the next log line owed."""
        due = self._next_trim
        if self._unlogged_drops or not self.stats.up:
            due = min(due, self._last_log + LOG_INTERVAL_S)
        return max(0.0, due - time.monotonic())

    def _write(self, batch: list) -> None:
        rows: dict[str, tuple] = {}   # one row per request: the newest state wins
        failed_encoding = missing = 0
        try:
            for item in batch:
                try:
                    record = self._resolve(item)
                    if record is None:     # a change to a record the database does not hold
                        missing += 1
                        continue
                    rows[record.request_id] = self._row(record)
                except _DatabaseError:
                    raise
                except Exception as exc:   # a record that cannot be encoded costs only itself
                    failed_encoding += 1
                    self._last_error = f"encoding {type(exc).__name__}: {exc}"
            if rows:
                self.sql.upsert(list(rows.values()))
        except Exception as exc:
            self._failed(batch, exc.__cause__ if isinstance(exc, _DatabaseError) else exc)
            return
        if not self.stats.up:
            log.warning("store %s: writing again", self.sql.url.redacted)
        self.stats.up = True
        self._backoff_s = 0.0
        with self._cond:
            self.stats.written += len(batch) - failed_encoding - missing
            self._done += len(batch) - failed_encoding
            if failed_encoding:
                self._drop_locked("encode_failed", failed_encoding)
            self._cond.notify_all()

    def _resolve(self, item) -> RequestRecord | None:
        """The record to write: the store's current copy of a submitted record, or a
        `Change` applied to the stored one (read here, off the event loop)."""
        if not isinstance(item, Change):
            return self.current(item)
        try:
            old = self.load(item.request_id)
        except Exception as exc:
            raise _DatabaseError() from exc
        return None if old is None else item.change(old)

    def _failed(self, batch: list, exc: BaseException) -> None:
        self.stats.failed_writes += 1
        self._last_error = _first_line(exc)
        if self.stats.up:   # the change of state is said at once, the rest per interval
            log.warning("store %s: writing failed, records wait and are retried: %s",
                        self.sql.url.redacted, self._last_error)
        self.stats.up = False
        self._backoff_s = min(MAX_BACKOFF_S, max(0.2, self._backoff_s * 2))
        with self._cond:
            # Keep the batch for the next try, within the bound; the rest is counted.
            room = max(0, self.max_pending - len(self._queue))
            self._retry = batch[:room]
            if len(batch) > room:
                self._drop_locked("write_failed", len(batch) - room)

    def _row(self, record: RequestRecord) -> tuple:
        verdict = record.verdict
        return (key_text(record.request_id), key_text(record.trace_id), key_text(record.model),
                self.clock.to_epoch_ns(record.start_ns), self.clock.to_epoch_ns(record.end_ns),
                record.ttft_ns, getattr(verdict, "cause", None), encode(record, self.clock))

    def _drop_locked(self, reason: str, n: int) -> None:
        self.stats.dropped[reason] += n
        self._done += n
        self._unlogged_drops += n
        self._cond.notify_all()

    def _trim(self) -> None:
        self._next_trim = time.monotonic() + self.retention_interval_s
        try:
            self.stats.trimmed += self.sql.trim(
                older_than_unix_ns=time.time_ns() - int(self.retention.max_age_s * 1e9),
                max_bytes=self.retention.max_bytes)
            self.stats.size_bytes = self.sql.size_bytes()
            self.stats.oldest_end_unix_ns = self.sql.oldest_end_unix_ns()
        except Exception as exc:
            self.stats.up = False
            self._last_error = f"retention: {_first_line(exc)}"

    def _log_drops(self) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        if self._unlogged_drops or not self.stats.up:
            self._last_log = now
            log.warning("store %s: %s; %d records dropped in the last %.0f s, %d waiting "
                        "(ttftscope_store_records_dropped_total counts them); last error: %s",
                        self.sql.url.redacted, "writing" if self.stats.up else "failing",
                        self._unlogged_drops, LOG_INTERVAL_S, self.pending,
                        self._last_error or "none")
            self._unlogged_drops = 0


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
