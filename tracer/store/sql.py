"""The SQL side of the store: one class for SQLite and PostgreSQL, which differ only in
how a connection is made, a placeholder is spelt and the size is measured.

Every value reaches the database as a bound parameter, never spliced into SQL. Each thread
keeps its own connection (the writer thread writes, the /ui reads run on a thread pool):
SQLite connections cannot be shared across threads and a PostgreSQL one serialises its
users. A connection that failed is dropped and made anew on the next call, so a database
that was down is used again once it is back, without a restart.
"""
from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
from pathlib import Path

from tracer.store.schema import (
    POSTGRESQL,
    SCHEMA_VERSION,
    SQLITE,
    StoreError,
    StoreVersionError,
    migrations,
)
from tracer.store.url import StoreURL

log = logging.getLogger("ttftscope.store")

# How long a statement may wait for another process's lock (SQLite) or run (PostgreSQL)
# before it fails; the writer then keeps the batch and tries again.
STATEMENT_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5
# A size trim leaves the store at this share of its bound, so it does not trim every time.
TRIM_TO_SHARE = 0.9
# The SQLite WAL's size after a checkpoint: the file stays within the size bound plus this.
WAL_LIMIT_BYTES = 4 * 1024 * 1024   # about one auto-checkpoint (1,000 pages of 4 KiB)
_DELETE_CHUNK = 5_000
# Column values are looked up by equality; past this they are cut (the document keeps the
# whole string).
MAX_KEY_CHARS = 512
_COLUMNS = "request_id, trace_id, model, start_unix_ns, end_unix_ns, ttft_ns, cause, doc"
_UPSERT = (f"INSERT INTO records ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
           "ON CONFLICT (request_id) DO UPDATE SET trace_id = excluded.trace_id, "
           "model = excluded.model, start_unix_ns = excluded.start_unix_ns, "
           "end_unix_ns = excluded.end_unix_ns, ttft_ns = excluded.ttft_ns, "
           "cause = excluded.cause, doc = excluded.doc")
# PostgreSQL's transaction-scoped advisory lock taken by a migration: two replicas starting
# together migrate once.
_MIGRATION_LOCK = 0x7474_6674


def key_text(value: str) -> str:
    """`value` as a column may hold it: NUL and unpaired surrogates (bytes that were not
    UTF-8) escaped, at most MAX_KEY_CHARS. Lookups apply the same, so they still match.

    >>> key_text("a\\x00b"), key_text("\\udcff")
    ('a\\\\x00b', '\\\\udcff')
    """
    if value.isascii() and "\x00" not in value and len(value) <= MAX_KEY_CHARS:
        return value
    text = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")[:MAX_KEY_CHARS]


class SqlStore:
    """Records as rows: `(request_id, trace_id, model, start, end, ttft, cause, doc)`."""

    def __init__(self, url: StoreURL, *, statement_timeout_s: float = STATEMENT_TIMEOUT_S,
                 connect_timeout_s: int = CONNECT_TIMEOUT_S) -> None:
        self.url = url
        self.dialect = SQLITE if url.scheme == "sqlite" else POSTGRESQL
        self._statement_timeout_s = statement_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._local = threading.local()
        self._connections: list = []
        self._connections_lock = threading.Lock()
        self.set_aside: Path | None = None   # where a corrupt SQLite file was moved

    # -- opening --------------------------------------------------------------------------

    def open(self) -> None:
        """Connects, brings the schema to this version, or raises `StoreError` saying why."""
        if self.dialect is SQLITE:
            self._open_sqlite()
        else:
            try:
                self._migrate(self._connection())
            except StoreError:
                raise
            except Exception as exc:
                raise StoreError(f"cannot use the PostgreSQL store {self.url.redacted}: "
                                 f"{_first_line(exc)}") from exc

    def _open_sqlite(self) -> None:
        path = self.url.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store's folder {path.parent}: {exc}") from exc
        try:
            self._migrate(self._connection())
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise StoreError(f"cannot use the SQLite store {path}: {exc}") from exc
            # Not a database, or a damaged one: keep it aside for whoever wants to look, and
            # start a fresh file, rather than fail every start (a crash loop under systemd).
            self._drop_connection()
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                part = Path(f"{path}{suffix}")
                if part.exists():
                    part.rename(Path(f"{aside}{suffix}"))
            self.set_aside = aside
            log.warning("the SQLite store %s was not a readable database (%s): moved to %s, "
                        "starting a new one", path, exc, aside)
            self._migrate(self._connection())

    def _migrate(self, conn) -> None:
        with self._transaction(conn, exclusive=True) as cur:
            if self.dialect is POSTGRESQL:
                cur.execute(self._sql("SELECT pg_advisory_xact_lock(?)"), (_MIGRATION_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS ttftscope_schema (version INTEGER NOT NULL)")
            cur.execute("SELECT max(version) FROM ttftscope_schema")
            version = cur.fetchone()[0] or 0
            if version > SCHEMA_VERSION:
                raise StoreVersionError(
                    f"the store {self.url.redacted} has schema version {version}, and this "
                    f"ttftscope reads up to version {SCHEMA_VERSION}: upgrade ttftscope, or "
                    "point --store at another database")
            for number, statements in enumerate(migrations(self.dialect), start=1):
                if number <= version:
                    continue
                for statement in statements:
                    cur.execute(statement)
                cur.execute(self._sql("INSERT INTO ttftscope_schema (version) VALUES (?)"),
                            (number,))
                if version:
                    log.info("store %s migrated to schema version %d", self.url.redacted,
                             number)

    # -- connections ----------------------------------------------------------------------

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    def _connect(self):
        if self.dialect is SQLITE:
            # autocommit (isolation_level None): transactions are the explicit BEGINs below.
            conn = sqlite3.connect(self.url.path, timeout=self._statement_timeout_s,
                                   isolation_level=None, check_same_thread=False)
            try:
                # Incremental vacuum only takes effect on a new file (before any table).
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("PRAGMA journal_mode = WAL")
                # WAL + NORMAL: a committed batch survives the process being killed (the WAL
                # is in the OS's hands); only a power cut can take the last few.
                conn.execute("PRAGMA synchronous = NORMAL")
                # A checkpoint cuts the WAL back to this; without it the WAL keeps its
                # largest size, and the file outgrows the size bound (1.9x in a soak).
                conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            except BaseException:
                conn.close()
                raise
            return conn
        import psycopg   # only a PostgreSQL store needs the driver loaded
        return psycopg.connect(
            self.url.dsn, autocommit=True, connect_timeout=self._connect_timeout_s,
            options=f"-c statement_timeout={int(self._statement_timeout_s * 1000)}")

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._connections_lock:
                if conn in self._connections:
                    self._connections.remove(conn)
            try:
                conn.close()
            except Exception:   # already broken: closing it is best effort
                pass

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            try:
                conn.close()
            except Exception:
                pass
        self._local = threading.local()

    def _sql(self, statement: str) -> str:
        return statement if self.dialect is SQLITE else statement.replace("?", "%s")

    class _Tx:
        def __init__(self, store: SqlStore, conn, exclusive: bool) -> None:
            self.store, self.conn, self.exclusive = store, conn, exclusive

        def __enter__(self):
            self.cur = self.conn.cursor()
            if self.store.dialect is SQLITE:
                self.cur.execute("BEGIN IMMEDIATE" if self.exclusive else "BEGIN")
            else:
                self.cur.execute("BEGIN")
            return self.cur

        def __exit__(self, kind, exc, tb):
            try:
                self.cur.execute("COMMIT" if kind is None else "ROLLBACK")
            except Exception:
                if kind is None:
                    raise
            finally:
                self.cur.close()
            return False

    def _transaction(self, conn, *, exclusive: bool = False):
        return SqlStore._Tx(self, conn, exclusive)

    def _run(self, fn):
        """`fn(connection)`; a connection that failed is dropped for the next call."""
        try:
            return fn(self._connection())
        except Exception:
            self._drop_connection()
            raise

    # -- writing --------------------------------------------------------------------------

    def upsert(self, rows: list[tuple]) -> None:
        """Writes `rows` (in `_COLUMNS` order) in one transaction: all or none."""
        def write(conn):
            with self._transaction(conn, exclusive=True) as cur:
                cur.executemany(self._sql(_UPSERT), rows)
        self._run(write)

    def trim(self, *, older_than_unix_ns: int, max_bytes: int | None) -> int:
        """Deletes the records that ended before `older_than_unix_ns`, then the oldest ones
        while the store is over `max_bytes`; the number deleted."""
        deleted = 0
        while True:
            n = self._delete_oldest(_DELETE_CHUNK, before_unix_ns=older_than_unix_ns)
            deleted += n
            if n < _DELETE_CHUNK:
                break
        if max_bytes is not None:
            used = self.size_bytes()
            if used > max_bytes:
                rows = self.count()
                excess = 1.0 - TRIM_TO_SHARE * max_bytes / used
                deleted += self._delete_oldest(max(1, math.ceil(rows * excess)))
                self._reclaim()
        return deleted

    def _delete_oldest(self, n: int, *, before_unix_ns: int | None = None) -> int:
        where = "" if before_unix_ns is None else "WHERE end_unix_ns < ? "
        params = () if before_unix_ns is None else (before_unix_ns,)

        def delete(conn):
            with self._transaction(conn, exclusive=True) as cur:
                cur.execute(self._sql(
                    "DELETE FROM records WHERE request_id IN (SELECT request_id FROM records "
                    f"{where}ORDER BY end_unix_ns LIMIT ?)"), (*params, n))
                return cur.rowcount
        return self._run(delete)

    def _reclaim(self) -> None:
        # SQLite: hand the freed pages back to the file system, and cut the WAL back (a
        # reader in the middle of a read makes the checkpoint partial: the next pass
        # finishes it). PostgreSQL: make the dead rows' space reusable now rather than at
        # autovacuum's next pass.
        def reclaim(conn):
            if self.dialect is SQLITE:
                conn.execute("PRAGMA incremental_vacuum").fetchall()
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            else:
                conn.execute("VACUUM records")
        self._run(reclaim)

    # -- reading --------------------------------------------------------------------------

    def _fetch(self, statement: str, params: tuple) -> list:
        def fetch(conn):
            cur = conn.cursor()
            try:
                cur.execute(self._sql(statement), params)
                return cur.fetchall()
            finally:
                cur.close()
        return self._run(fetch)

    def by_trace(self, trace_id: str) -> str | None:
        """The newest document of `trace_id` (two requests may share one)."""
        rows = self._fetch("SELECT doc FROM records WHERE trace_id = ? "
                           "ORDER BY end_unix_ns DESC LIMIT 1", (key_text(trace_id),))
        return rows[0][0] if rows else None

    def by_request(self, request_id: str) -> str | None:
        rows = self._fetch("SELECT doc FROM records WHERE request_id = ?",
                           (key_text(request_id),))
        return rows[0][0] if rows else None

    def window(self, from_unix_ns: int, to_unix_ns: int, *, limit: int, order: str,
               model: str | None = None) -> list[str]:
        """Documents of requests that started in [from, to): the latest start first
        (`recent`) or the slowest TTFT first (`slowest`: those with a first token only).
        Both walk the (start, ttft) index: `recent` backwards from `to`, stopping at
        `limit`, so the table's first view costs 50 rows whatever its size."""
        where = "start_unix_ns >= ? AND start_unix_ns < ?"
        params: tuple = (from_unix_ns, to_unix_ns)
        if model is not None:
            where += " AND model = ?"
            params += (key_text(model),)
        if order == "slowest":
            # The (start, ttft) index finds the window and the sort ranks its keys alone;
            # only the `limit` winners' documents are read. Sorting the documents with them
            # (one statement) cost 2.2 ms against 0.5 at 1 M rows, growing with the window
            # (bench/store_bench.py, part 3).
            key = self.dialect.row_key
            statement = (f"SELECT doc FROM records WHERE {key} IN (SELECT {key} FROM records "
                         f"WHERE {where} AND ttft_ns IS NOT NULL ORDER BY ttft_ns DESC "
                         "LIMIT ?) ORDER BY ttft_ns DESC")
        else:
            statement = (f"SELECT doc FROM records WHERE {where} "
                         "ORDER BY start_unix_ns DESC LIMIT ?")
        return [row[0] for row in self._fetch(statement, (*params, limit))]

    def overlapping(self, from_unix_ns: int, to_unix_ns: int, *, limit: int) -> list[str]:
        """Documents of requests whose [start, end] overlaps [from, to], oldest end first."""
        return [row[0] for row in self._fetch(
            "SELECT doc FROM records WHERE end_unix_ns >= ? AND start_unix_ns <= ? "
            "ORDER BY end_unix_ns LIMIT ?", (from_unix_ns, to_unix_ns, limit))]

    def count(self) -> int:
        return self._fetch("SELECT count(*) FROM records", ())[0][0]

    def oldest_end_unix_ns(self) -> int | None:
        return self._fetch("SELECT min(end_unix_ns) FROM records", ())[0][0]

    def size_bytes(self) -> int:
        """The space the records take: SQLite's pages in use (free pages excluded, the
        file's size is at most one trim's worth more), PostgreSQL's table with its indexes
        and TOAST."""
        if self.dialect is SQLITE:
            def used(conn):
                (page_size,), = conn.execute("PRAGMA page_size").fetchall()
                (pages,), = conn.execute("PRAGMA page_count").fetchall()
                (free,), = conn.execute("PRAGMA freelist_count").fetchall()
                return (pages - free) * page_size
            return self._run(used)
        return self._fetch("SELECT pg_total_relation_size('records')", ())[0][0]

    def file_bytes(self) -> int | None:
        """SQLite: the file and its WAL on disk; None for PostgreSQL."""
        if self.dialect is not SQLITE:
            return None
        return sum(os.path.getsize(p) for p in (self.url.path, Path(f"{self.url.path}-wal"))
                   if os.path.exists(p))


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text or "corrupt" in text


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
