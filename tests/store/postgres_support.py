"""A real PostgreSQL 15 for the record store's tests: a throwaway cluster on loopback.

Debian's postgresql-15 (`make install` installs it, tools/install_system_deps.sh) provides
initdb and pg_ctl under /usr/lib/postgresql/15/bin and the `postgres` system user. The cluster
lives in a temporary directory owned by that user; initdb and pg_ctl run as it (`runuser -u
postgres --` when the tests run as root: initdb refuses root), or as the current user
otherwise. It listens on 127.0.0.1 only, on a port found free by binding port 0 first, and on
a Unix socket inside the directory, never on the default 5432 or /var/run/postgresql.
Durability settings are PostgreSQL's defaults (fsync, full_page_writes, synchronous_commit
on): the tests kill the server (`stop("immediate")`) and check what survives.

Authentication is `trust` on the Unix socket (the harness's own administration, always) and,
by default, on 127.0.0.1; `require_password()` switches the TCP connections to scram-sha-256.

For example::

    with PostgresServer() as pg:          # initdb, start, CREATE DATABASE ttftscope
        pg.dsn                            # 'postgresql://postgres@127.0.0.1:41234/ttftscope'
        dsn = pg.create_database("t_1")   # another database, its DSN
        pg.stop("immediate")              # as if the machine lost power
        pg.start()                        # crash recovery, same port
    # stopped and its directory removed

Every subprocess has a timeout and every wait is a bounded poll of a real condition.
"""
from __future__ import annotations

import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_PACKAGE = "postgresql-15"
SUPERUSER = "postgres"
# pg_ctl's own wait (-t) for start and stop; the subprocess timeout leaves it room to report.
PG_CTL_WAIT_S = 60
SUBPROCESS_MARGIN_S = 30
CONNECT_TIMEOUT_S = 10
STOP_MODES = ("smart", "fast", "immediate")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def free_port() -> int:
    """A loopback port free a moment ago (a race with another process is retried by start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """One PostgreSQL 15 cluster in a temporary directory; a context manager.

    `__enter__` runs `init()`, `start()` and `create_database(database)`; `__exit__` runs
    `cleanup()` (stops the server if it runs and removes the directory)."""

    def __init__(self, database: str = "ttftscope", *, bin_dir: Path = PG_BIN,
                 parent_dir: Path | None = None) -> None:
        self.database = _check_identifier(database)
        self.bin_dir = Path(bin_dir)
        self._parent_dir = parent_dir
        self.root: Path | None = None
        self.port: int | None = None
        self._started_once = False
        self._as_postgres = os.geteuid() == 0

    # -- paths ---------------------------------------------------------------------------

    def _path(self, *parts: str) -> Path:
        if self.root is None:
            raise RuntimeError("PostgresServer.init() has not run")
        return self.root.joinpath(*parts)

    @property
    def data_dir(self) -> Path:
        return self._path("data")

    @property
    def socket_dir(self) -> Path:
        return self._path("socket")

    @property
    def log_path(self) -> Path:
        return self._path("postgres.log")

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> PostgresServer:
        try:
            self.init()
            self.start()
            self.create_database(self.database)
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.cleanup()

    def init(self) -> None:
        """A fresh cluster: the temporary directory (owned by `postgres` when run as root),
        initdb (UTF8, C locale, trust), then this harness's settings and pg_hba.conf."""
        if self.root is not None:
            raise RuntimeError("PostgresServer.init() already ran")
        initdb = self.bin_dir / "initdb"
        if not initdb.exists():
            pytest.fail(f"{initdb} is missing: apt-get install -y {PG_PACKAGE} "
                        f"(`make install` does it, with its daemon kept from starting)")
        owner = None
        if self._as_postgres:
            try:
                owner = pwd.getpwnam(SUPERUSER)
            except KeyError:
                pytest.fail(f"no `{SUPERUSER}` system user: apt-get install -y {PG_PACKAGE}")
        self.root = Path(tempfile.mkdtemp(prefix="ttftscope-pg-", dir=self._parent_dir))
        self.socket_dir.mkdir(mode=0o700)
        if owner is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        self._run([str(initdb), "-D", str(self.data_dir), "--username", SUPERUSER,
                   "--auth-local=trust", "--auth-host=trust", "--encoding=UTF8",
                   "--no-locale", "--no-instructions"], timeout_s=180, what="initdb")
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# ttftscope tests (tests/store/postgres_support.py)\n"
                       "include_if_exists = 'ttftscope_test.conf'\n")
        self.port = free_port()
        self._write_settings()
        self._write_hba(password=False)

    def _write_settings(self) -> None:
        # Loopback and our own socket directory only; small memory; durability left at its
        # defaults (no fsync=off: the tests kill the server and read back what it had).
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "shared_buffers": "'16MB'",
            "max_connections": "50",
            "password_encryption": "'scram-sha-256'",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        self._write_owned(self.data_dir / "ttftscope_test.conf",
                          "".join(f"{key} = {value}\n" for key, value in settings.items()))

    def _write_hba(self, *, password: bool) -> None:
        method = "scram-sha-256" if password else "trust"
        self._write_owned(self.data_dir / "pg_hba.conf", (
            "# Written by tests/store/postgres_support.py.\n"
            "# TYPE  DATABASE  USER  ADDRESS       METHOD\n"
            "local   all       all                 trust\n"
            f"host    all       all   127.0.0.1/32  {method}\n"))

    def _write_owned(self, path: Path, text: str) -> None:
        path.write_text(text)
        path.chmod(0o600)
        if self._as_postgres:
            owner = pwd.getpwnam(SUPERUSER)
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def start(self, attempts: int = 3) -> None:
        """`pg_ctl -w start`: returns once the server accepts connections. The first start
        moves to another free port if the chosen one was taken meanwhile (at most `attempts`
        tries); later starts keep the port, so DSNs handed out stay valid."""
        for attempt in range(attempts):
            try:
                self._pg_ctl("start", "-w", "-t", str(PG_CTL_WAIT_S), "-l", str(self.log_path))
                self._started_once = True
                return
            except AssertionError:
                port_taken = "Address already in use" in self.log_tail()
                if self._started_once or not port_taken or attempt == attempts - 1:
                    raise
                self.port = free_port()
                self._write_settings()

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m MODE -w`: "fast" rolls back sessions and checkpoints; "immediate"
        quits every process at once, as a crash would (the next start recovers from WAL)."""
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode {mode!r}: one of {STOP_MODES}")
        self._pg_ctl("stop", "-m", mode, "-w", "-t", str(PG_CTL_WAIT_S))

    def is_running(self) -> bool:
        """`pg_ctl status`: 0 running, 3 not running."""
        if self.root is None or not self.data_dir.exists():
            return False
        run = self._run([str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.data_dir)],
                        timeout_s=30, what="pg_ctl status", check=False)
        if run.returncode not in (0, 3):
            raise AssertionError(f"pg_ctl status exited {run.returncode}: {run.stderr}")
        return run.returncode == 0

    def cleanup(self) -> None:
        """Stop the server if it runs (immediate: nothing is kept) and remove the directory."""
        if self.root is None:
            return
        try:
            if self.is_running():
                self.stop("immediate")
        except (AssertionError, subprocess.TimeoutExpired):
            self._kill_postmaster()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _kill_postmaster(self) -> None:
        # Last resort when pg_ctl could not stop it: the postmaster this harness started
        # (postmaster.pid's first line); its children exit when they find it gone.
        try:
            pid = int(self._path("data", "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass

    # -- connections and SQL -------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """`postgresql://postgres@127.0.0.1:PORT/<database>` (TCP on loopback)."""
        return self.dsn_for(self.database)

    def dsn_for(self, database: str | None = None, *, user: str = SUPERUSER,
                password: str | None = None) -> str:
        if self.port is None:
            raise RuntimeError("PostgresServer.init() has not run")
        auth = quote(user, safe="") + ("" if password is None else ":" + quote(password, safe=""))
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database or self.database}"

    def admin_connect(self, dbname: str = "postgres") -> psycopg.Connection:
        """A superuser connection over the Unix socket (always trust), autocommit."""
        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=SUPERUSER,
                               dbname=dbname, autocommit=True,
                               connect_timeout=CONNECT_TIMEOUT_S,
                               options="-c statement_timeout=60000")

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (owner postgres, UTF8, from template1); its DSN."""
        with self.admin_connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(
                sql.Identifier(_check_identifier(name))))
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE ... WITH (FORCE): connections still open to it are ended."""
        with self.admin_connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(_check_identifier(name))))

    def set_password(self, user: str, password: str) -> None:
        """Give `user` a password (stored as a SCRAM-SHA-256 verifier), creating it as a
        login role if it does not exist. Passwords matter once `require_password()` ran."""
        role = sql.Identifier(_check_identifier(user))
        with self.admin_connect() as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                  (user,)).fetchone()
            # Utility statements take no bound parameters: the literal is quoted client-side.
            verb = "ALTER ROLE {} WITH LOGIN PASSWORD {}" if exists else \
                "CREATE ROLE {} WITH LOGIN PASSWORD {}"
            conn.execute(sql.SQL(verb).format(role, sql.Literal(password)))

    def require_password(self, required: bool = True) -> None:
        """TCP connections on 127.0.0.1 need a password (scram-sha-256), or, with
        `required=False`, are trusted again. Rewrites pg_hba.conf and reloads; returns once
        the postmaster has loaded it (a new session sees pg_conf_load_time() move)."""
        self._write_hba(password=required)
        with self.admin_connect() as conn:
            errors = conn.execute("SELECT line_number, error FROM pg_hba_file_rules "
                                  "WHERE error IS NOT NULL").fetchall()
            if errors:
                raise AssertionError(f"pg_hba.conf rejected: {errors}")
            before = conn.execute("SELECT pg_conf_load_time()").fetchone()[0]
            assert conn.execute("SELECT pg_reload_conf()").fetchone()[0] is True
        # Sessions are forked from the postmaster after its SIGHUP handler (which reloads
        # pg_hba.conf) finished, so a new session showing the new load time sees the new rules.
        wake = threading.Event()
        for _ in range(400):
            with self.admin_connect() as conn:
                if conn.execute("SELECT pg_conf_load_time()").fetchone()[0] > before:
                    return
            wake.wait(0.025)
        raise AssertionError(f"the server did not reload pg_hba.conf:\n{self.log_tail()}")

    # -- subprocesses --------------------------------------------------------------------

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess:
        return self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args],
                         timeout_s=PG_CTL_WAIT_S + SUBPROCESS_MARGIN_S, what=f"pg_ctl {args[0]}")

    def _run(self, cmd: list[str], *, timeout_s: float, what: str,
             check: bool = True) -> subprocess.CompletedProcess:
        if self._as_postgres:
            cmd = ["runuser", "-u", SUPERUSER, "--", *cmd]
        # English messages whatever the machine's locale; pg_ctl -l sends the server's own
        # output to the log, so the pipes close when pg_ctl exits.
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        for name in ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD"):
            env.pop(name, None)
        run = subprocess.run(cmd, cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=timeout_s)
        if check and run.returncode != 0:
            raise AssertionError(
                f"{what} exited {run.returncode}\nstdout:\n{run.stdout[-3000:]}\n"
                f"stderr:\n{run.stderr[-3000:]}\nserver log:\n{self.log_tail()}")
        return run

    def log_tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except (OSError, RuntimeError):
            return ""


def _check_identifier(name: str) -> str:
    """Database and role names the harness makes: lower-case SQL identifiers, 63 bytes."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r}: use [a-z_][a-z0-9_]*, at most 63 characters")
    return name


def connect_error(dsn: str) -> psycopg.OperationalError:
    """The error a connection to `dsn` fails with; an AssertionError if it connects."""
    try:
        psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S).close()
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError(f"{dsn} accepted a connection")


# -- fixtures: a test module takes them with `from postgres_support import postgres_dsn`
# (not a conftest.py: tests/proxy and tests/engine have one, and pytest's default import
# mode cannot hold two modules named `conftest` in one session).

_DATABASES = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's server, started once, with its database `ttftscope`; stopped and its
    directory removed at the end. Tests that stop it or change its authentication make
    their own `PostgresServer()` instead."""
    with PostgresServer(database="ttftscope") as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The DSN of a database made for this test alone (`test_1`, `test_2`, ...), dropped
    afterwards (connections the test left open are ended)."""
    name = f"test_{next(_DATABASES)}"
    dsn = postgres_server.create_database(name)
    yield dsn
    postgres_server.drop_database(name)
