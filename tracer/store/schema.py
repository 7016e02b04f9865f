"""The store's tables, one migration a version, for both SQL dialects.

A store records the version it was last migrated to (`ttftscope_schema`). Opening one runs
the migrations it lacks, each in its own transaction; a store newer than this code is
refused (`StoreVersionError`) rather than misread or "repaired" (an older ttftscope next to
newer replicas on one database must not undo their migrations).

Version 1 kept the record document and the columns its lookups need; version 2 added the
verdict's cause as a column, backfilled from the documents, and the index that answers
"the slowest requests in a window" without reading them.
"""
from __future__ import annotations

from dataclasses import dataclass


class StoreError(Exception):
    """A store that cannot be used as configured; the message says what to do."""


class StoreVersionError(StoreError):
    pass


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str            # "sqlite" | "postgresql"
    int64: str           # the column type of a ns timestamp
    json_cause: str      # SQL reading the verdict's cause out of a row's `doc`
    row_key: str         # the cheapest key of a row, for reading documents after ranking keys


SQLITE = Dialect("sqlite", "INTEGER", "json_extract(doc, '$.verdict.cause')", "rowid")
# PostgreSQL's json de-escapes every string on the way to `verdict` and refuses \u0000 and a
# lone surrogate (which a document holds for NUL and bytes that were not UTF-8): those
# escapes become \ufffd for the read only (still valid JSON; the row is not changed).
POSTGRESQL = Dialect("postgresql", "BIGINT",
                     r"(regexp_replace(doc, '\\u(0000|[dD][89a-fA-F][0-9a-fA-F]{2})', "
                     r"'\\ufffd', 'g')::json -> 'verdict' ->> 'cause')", "request_id")


def migrations(d: Dialect) -> tuple[tuple[str, ...], ...]:
    """The statements of each version, in order: `migrations(d)[v - 1]` brings a store at
    version v - 1 to v."""
    return (
        (   # 1: the records
            f"""CREATE TABLE records (
                request_id TEXT PRIMARY KEY,
                trace_id TEXT NOT NULL,
                model TEXT NOT NULL,
                start_unix_ns {d.int64} NOT NULL,
                end_unix_ns {d.int64} NOT NULL,
                ttft_ns {d.int64},
                doc TEXT NOT NULL)""",
            "CREATE INDEX records_trace ON records (trace_id)",
            "CREATE INDEX records_end ON records (end_unix_ns)",
        ),
        (   # 2: the cause as a column; "slowest in a window" from one index
            "ALTER TABLE records ADD COLUMN cause TEXT",
            f"UPDATE records SET cause = {d.json_cause}",
            "CREATE INDEX records_start_ttft ON records (start_unix_ns, ttft_ns)",
        ),
    )


SCHEMA_VERSION = 2
