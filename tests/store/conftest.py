"""A real PostgreSQL 15 for the record store's tests (tests/store/postgres_support.py): one
server for the session, a fresh database for each test that asks for one."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from postgres_support import PostgresServer

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
