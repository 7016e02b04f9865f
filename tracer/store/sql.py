"""The SQL side of the store: the records' statements, one class for SQLite and PostgreSQL,
which differ only in how a connection is made, a placeholder is spelt and the size is
measured.

Every value reaches the database as a bound parameter, never spliced into SQL. The
connections, the schema's migration and the transactions are `Database`'s
(tracer/store/database.py), which `SqlStore` is.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from tracer.store.database import Database
from tracer.store.schema import SQLITE

# A size trim leaves the store at this share of its bound, so it does not trim every time.
TRIM_TO_SHARE = 0.9
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


class SqlStore(Database):
    """Records as rows: `(request_id, trace_id, model, start, end, ttft, cause, doc)`."""

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
