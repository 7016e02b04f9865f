"""The PostgreSQL test harness itself (postgres_support.py, conftest.py): a real PostgreSQL 15
on loopback, a fresh database per test, committed data surviving a fast stop and a crash
(immediate stop), and password authentication that refuses a wrong password.

Tests that stop the server or change its authentication run their own `PostgresServer`, so
the session's server stays as the other tests expect it."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from postgres_support import PostgresServer, connect_error, postgres_dsn, postgres_server  # noqa: F401 (fixtures)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    with PostgresServer(database="ttftscope") as server:
        yield server


def test_the_session_server_is_postgresql_15_on_loopback(postgres_server, postgres_dsn):
    assert re.fullmatch(r"postgresql://postgres@127\.0\.0\.1:\d+/ttftscope", postgres_server.dsn)
    assert postgres_dsn.startswith(f"postgresql://postgres@127.0.0.1:{postgres_server.port}/")
    with psycopg.connect(postgres_dsn, connect_timeout=10) as conn:
        version, = conn.execute("SELECT version()").fetchone()
        assert version.startswith("PostgreSQL 15."), version
        assert conn.info.server_version // 10000 == 15
        row = conn.execute("SELECT current_database(), host(inet_server_addr()), "
                           "current_setting('listen_addresses'), current_setting('fsync'), "
                           "current_setting('server_encoding')").fetchone()
        assert row == (postgres_dsn.rsplit("/", 1)[1], "127.0.0.1", "127.0.0.1", "on", "UTF8")
        # Only the harness's socket and loopback are let in.
        rules = conn.execute("SELECT type, address, auth_method FROM pg_hba_file_rules "
                             "ORDER BY line_number").fetchall()
        assert rules == [("local", None, "trust"), ("host", "127.0.0.1", "trust")]
    with psycopg.connect(postgres_server.dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("ttftscope",)


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_database(postgres_server, postgres_dsn, run):
    name = postgres_dsn.rsplit("/", 1)[1]
    assert re.fullmatch(r"test_\d+", name) and name != postgres_server.database
    with psycopg.connect(postgres_dsn, connect_timeout=10, autocommit=True) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables "
                              "WHERE schemaname = 'public'").fetchone()
        assert tables == (0,)
        # Fails in the second run if the first run's database were handed out again.
        conn.execute("CREATE TABLE marker (run int)")
        conn.execute("INSERT INTO marker VALUES (%s)", (run,))
    with psycopg.connect(postgres_server.dsn, connect_timeout=10) as conn:
        assert conn.execute("SELECT to_regclass('public.marker')").fetchone() == (None,)


def _count(dsn: str) -> int:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        return conn.execute("SELECT count(*) FROM kept").fetchone()[0]


def test_committed_data_survives_a_fast_stop_and_a_crash(own_server):
    dsn = own_server.dsn
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept SELECT generate_series(1, 1000)")
    own_server.stop("fast")
    assert not own_server.is_running()
    assert isinstance(connect_error(dsn), psycopg.OperationalError)
    own_server.start()
    assert own_server.dsn == dsn              # same port after a restart
    assert _count(dsn) == 1000

    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("INSERT INTO kept SELECT generate_series(1, 500)")
        # Committed on leaving the block; the open session below is cut by the crash.
    session = psycopg.connect(dsn, connect_timeout=10)
    session.execute("INSERT INTO kept VALUES (-1)")     # never committed
    own_server.stop("immediate")
    assert not own_server.is_running()
    error = connect_error(dsn)
    assert "Connection refused" in str(error), error
    with pytest.raises(psycopg.OperationalError):
        session.execute("SELECT 1")
    session.close()
    own_server.start()                        # crash recovery from the WAL
    assert _count(dsn) == 1500


def test_a_wrong_password_is_refused_once_passwords_are_required(own_server):
    own_server.set_password("writer", "right-password")
    wrong = own_server.dsn_for(user="writer", password="wrong-password")
    # Trust first: any password (or none) is accepted, so the switch below is what refuses.
    psycopg.connect(wrong, connect_timeout=10).close()

    own_server.require_password()
    error = connect_error(wrong)
    assert 'password authentication failed for user "writer"' in str(error), error
    assert "authentication" in str(error)
    assert isinstance(connect_error(own_server.dsn_for(user="writer")), psycopg.OperationalError)
    assert isinstance(connect_error(own_server.dsn), psycopg.OperationalError)
    right = own_server.dsn_for(user="writer", password="right-password")
    with psycopg.connect(right, connect_timeout=10) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("writer",)
    # The harness's own administration (Unix socket) still works.
    assert own_server.create_database("after_password").endswith("/after_password")

    own_server.require_password(False)
    psycopg.connect(own_server.dsn, connect_timeout=10).close()


def test_leaving_the_context_stops_the_server_and_removes_its_directory():
    with PostgresServer(database="ttftscope") as server:
        root, dsn = server.root, server.dsn
        assert root is not None and (root / "data" / "PG_VERSION").read_text().strip() == "15"
        assert server.is_running()
    assert server.root is None and not Path(root).exists()
    assert isinstance(connect_error(dsn), psycopg.OperationalError)


def test_stop_modes_are_checked(own_server):
    with pytest.raises(ValueError):
        own_server.stop("kill")
    assert own_server.is_running()
