"""The database a store's records live in, SQLite or PostgreSQL: its connections, the schema
brought to this version when it opens, and the transactions the statements run in.

Apart from the records' statements (tracer/store/sql.py, `SqlStore`, built on this class)
because keeping a database usable is its own work. Each thread keeps its own connection (the
writer thread writes, the /ui reads run on a thread pool): SQLite connections cannot be
shared across threads and a PostgreSQL one serialises its users. A connection that failed is
dropped and made anew on the next call, so a database that was down is used again once it is
back, without a restart. A corrupt SQLite file is set aside rather than failing every start.
"""
from __future__ import annotations

import logging
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
# The SQLite WAL's size after a checkpoint: the file stays within the size bound plus this.
WAL_LIMIT_BYTES = 4 * 1024 * 1024   # about one auto-checkpoint (1,000 pages of 4 KiB)
# PostgreSQL's transaction-scoped advisory lock taken by a migration: two replicas starting
# together migrate once.
_MIGRATION_LOCK = 0x7474_6674


class Database:
    """One SQLite file or PostgreSQL database, reached through a connection per thread."""

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
        def __init__(self, store: Database, conn, exclusive: bool) -> None:
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
        return Database._Tx(self, conn, exclusive)

    def _run(self, fn):
        """`fn(connection)`; a connection that failed is dropped for the next call."""
        try:
            return fn(self._connection())
        except Exception:
            self._drop_connection()
            raise


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text or "corrupt" in text


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
