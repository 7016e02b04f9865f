"""`--store URL` and `--data-dir`: which backend keeps the records, and where.

- `memory`: the in-process ring only (lost on restart, one per process);
- `sqlite:///ABSOLUTE/PATH` or `sqlite:RELATIVE/PATH` (relative to the data directory):
  a file, the default being `records.sqlite3` in the data directory;
- `postgresql://USER[:PASSWORD]@HOST:PORT/DB` (or `postgres://`): one database a fleet
  shares; libpq's own parameters (`?sslmode=require`) pass through.

The data directory defaults to `$XDG_DATA_HOME/ttftscope`, `~/.local/share/ttftscope`
when that is unset (the XDG base directory convention).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tracer.store.schema import StoreError

DEFAULT_SQLITE_NAME = "records.sqlite3"


def default_data_dir(environ: dict | None = None) -> Path:
    """The XDG data directory's `ttftscope` folder.

    >>> default_data_dir({"XDG_DATA_HOME": "/srv/data", "HOME": "/h"})
    PosixPath('/srv/data/ttftscope')
    >>> default_data_dir({"HOME": "/h"})
    PosixPath('/h/.local/share/ttftscope')
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_DATA_HOME") or ""
    if not os.path.isabs(base):     # the spec: a relative value is invalid, and ignored
        base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ttftscope"


@dataclass(frozen=True, slots=True)
class StoreURL:
    scheme: str                 # memory | sqlite | postgresql
    path: Path | None = None    # sqlite
    dsn: str | None = None      # postgresql, as given (password included)

    @property
    def redacted(self) -> str:
        """The URL for logs and errors: never the password."""
        if self.scheme == "memory":
            return "memory"
        if self.scheme == "sqlite":
            return f"sqlite:///{str(self.path).lstrip('/')}"
        parts = urlsplit(self.dsn)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))


def parse_store_url(url: str | None, data_dir: Path | str | None = None) -> StoreURL:
    """The store `url` names (None: the default SQLite file), or `StoreError`.

    >>> parse_store_url(None, "/d").path
    PosixPath('/d/records.sqlite3')
    >>> parse_store_url("sqlite:///var/lib/t.db").path, parse_store_url("sqlite:x.db", "/d").path
    (PosixPath('/var/lib/t.db'), PosixPath('/d/x.db'))
    >>> parse_store_url("postgresql://u:secret@db:5432/t").redacted
    'postgresql://u:***@db:5432/t'
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    if url is None or url == "":
        return StoreURL("sqlite", path=data_dir / DEFAULT_SQLITE_NAME)
    if url == "memory":
        return StoreURL("memory")
    scheme, _, rest = url.partition(":")
    if scheme == "sqlite":
        if rest.startswith("///"):
            path = Path("/" + rest[3:].lstrip("/"))
        elif rest.startswith("//"):
            raise StoreError(f"--store {url}: an SQLite URL has no host: write "
                             "sqlite:///ABSOLUTE/PATH or sqlite:RELATIVE/PATH")
        else:
            path = data_dir / rest
        if not path.name or path.is_dir():
            raise StoreError(f"--store {url}: {path} is a folder; name the database file")
        return StoreURL("sqlite", path=path)
    if scheme in ("postgresql", "postgres"):
        parts = urlsplit(url)
        if not parts.hostname and "host=" not in parts.query:
            raise StoreError(f"--store: a PostgreSQL URL needs a host: "
                             "postgresql://USER@HOST:PORT/DB")
        return StoreURL("postgresql", dsn=url)
    raise StoreError(f"--store {url.split('@')[-1][:80]!r}: not a store URL; use memory, "
                     "sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
