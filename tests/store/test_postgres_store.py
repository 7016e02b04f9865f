"""The record store on a real PostgreSQL 15 (tests/store/postgres_support.py), on loopback:
what one replica writes another reads on its own clock, changes reach the database, a
database killed under load costs only counted records and is used again once it is back,
connection failures say what and where (never the password), schema versions migrate or are
refused, hostile strings stay data, and retention deletes what it should.

Nothing here sleeps to synchronise: `StoreWriter.flush(timeout_s=...)` is the barrier for
writes; the few real asynchronous events (the writer thread noticing a dead server, coming
back by itself, trimming on its own schedule) are awaited by `wait_for`, a bounded poll.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from store_support import wait_for
from postgres_support import PostgresServer, free_port, postgres_dsn, postgres_server  # noqa: F401 (fixtures)
from tracer.core.diagnoser import Diagnoser
from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord, StageSpan, ToolCall
from tracer.record.stages import SERVER_STAGES
from tracer.store.codec import CUT_STRING_CHARS, MAX_DOC_BYTES, TRUNCATED_ATTR, encode
from tracer.store.open import open_store
from tracer.store.persistent import PersistentStore
from tracer.store.schema import (
    POSTGRESQL,
    SCHEMA_VERSION,
    StoreError,
    StoreVersionError,
    migrations,
)
from tracer.store.sql import SqlStore
from tracer.store.url import parse_store_url
from tracer.store.writer import Retention, StoreWriter
from tracer.web.observability import ObservabilitySettings, build_observability

MS = 1_000_000
DAY_NS = 86_400 * 10**9
FLUSH_S = 15.0
CONNECT_S = 10


def other_clock() -> Clock:
    """Another process's clock: its perf_counter axis is nowhere near this one's."""
    return Clock(wall_ns=time.time_ns(), perf_ns=987_654_321_000_000)


def make_record(request_id: str, *, base_ns: int | None = None, trace_id: str | None = None,
                model: str = "m", attrs: dict | None = None, client: dict | None = None,
                queue_ms: int = 1) -> RequestRecord:
    """A finished request with the nine stages (1 ms each but `queue`), events, tool
    calls, a client with stages and a block chain, starting at `base_ns` (perf ns; now by
    default)."""
    base = time.perf_counter_ns() if base_ns is None else base_ns
    ends = list(itertools.accumulate(
        (queue_ms if stage == "queue" else 1) * MS for stage in SERVER_STAGES))
    stages = tuple(StageSpan(stage, base + (ends[i - 1] if i else 0), base + ends[i], {"n": i})
                   for i, stage in enumerate(SERVER_STAGES))
    ttft = ends[-1]
    if client is None:
        client = {"outcome": "ok", "client_ttft_ms": 12.5, "sdk": "fetch",
                  "stages": [{"stage": "client.request", "start_ns": base - 2 * MS,
                              "end_ns": base},
                             {"stage": "client.first_token", "start_ns": base,
                              "end_ns": base + ttft + MS}]}
    return RequestRecord(
        request_id, trace_id or uuid.uuid4().hex, uuid.uuid4().hex[:16], model, "chat",
        base, base + ttft + 5 * MS, stages=stages, ttft_ns=ttft, first_output_ns=ttft,
        first_output_kind="text", tool_calls=(ToolCall("search", 2 * MS, 4 * MS),
                                              ToolCall(None, 3 * MS, None)),
        num_tool_calls=2, num_prompt_tokens=40, num_cached_tokens=16, num_output_tokens=7,
        events=(("prefill_chunk", base + 6 * MS, {"num_tokens": 24, "batch_size": 2}),
                ("preempted", base + 7 * MS, {})),
        attrs={"gen_ai.request.max_tokens": 64} if attrs is None else attrs,
        client=client, arrival_unix_ms=1_700_000_000_000,
        block_chain=bytes(range(256)) * 2)


def judged(record: RequestRecord) -> RequestRecord:
    Diagnoser().publish(record)
    assert record.verdict is not None
    return record


def client_on_epoch(client: dict | None, clock: Clock) -> dict | None:
    """`client` with its stages' times on the wall clock, to compare across clocks."""
    if client is None or not client.get("stages"):
        return client
    return dict(client, stages=[dict(s, start_ns=clock.to_epoch_ns(s["start_ns"]),
                                     end_ns=clock.to_epoch_ns(s["end_ns"]))
                                for s in client["stages"]])


def assert_same_record(back: RequestRecord, back_clock: Clock, original: RequestRecord,
                       clock: Clock) -> None:
    """`back` (read on `back_clock`) is `original` (made on `clock`): the same instants."""
    assert back.request_id == original.request_id and back.trace_id == original.trace_id
    assert back.span_id == original.span_id and back.model == original.model
    assert back_clock.to_epoch_ns(back.start_ns) == clock.to_epoch_ns(original.start_ns)
    assert back_clock.to_epoch_ns(back.end_ns) == clock.to_epoch_ns(original.end_ns)
    assert [(s.stage, s.duration_ns, s.attrs) for s in back.stages] == \
        [(s.stage, s.duration_ns, s.attrs) for s in original.stages]
    assert [back_clock.to_epoch_ns(s.start_ns) for s in back.stages] == \
        [clock.to_epoch_ns(s.start_ns) for s in original.stages]
    assert [(n, back_clock.to_epoch_ns(t), a) for n, t, a in back.events] == \
        [(n, clock.to_epoch_ns(t), a) for n, t, a in original.events]
    assert back.ttft_ns == original.ttft_ns
    assert back.first_output_ns == original.first_output_ns
    assert back.tool_calls == original.tool_calls and back.num_tool_calls == 2
    assert back.block_chain == original.block_chain
    assert back.attrs == original.attrs
    assert client_on_epoch(back.client, back_clock) == client_on_epoch(original.client, clock)
    assert (back.num_prompt_tokens, back.num_cached_tokens, back.num_output_tokens) == \
        (original.num_prompt_tokens, original.num_cached_tokens, original.num_output_tokens)
    if original.verdict is not None:
        assert back.verdict.cause == original.verdict.cause
        assert back.verdict.sentence() == original.verdict.sentence()
    assert back.verdict == original.verdict     # its findings and cold rules too


def rows_of(dsn: str, columns: str = "request_id") -> list[tuple]:
    with psycopg.connect(dsn, connect_timeout=CONNECT_S) as conn:
        return conn.execute(f"SELECT {columns} FROM records ORDER BY request_id").fetchall()


def schema_version_of(dsn: str) -> int | None:
    with psycopg.connect(dsn, connect_timeout=CONNECT_S) as conn:
        return conn.execute("SELECT max(version) FROM ttftscope_schema").fetchone()[0]


# -- 1. round trip ------------------------------------------------------------------------

def test_a_record_written_by_one_process_reads_the_same_in_another(postgres_dsn):
    clock = Clock()
    # A long queue the first request of a model cannot judge yet: a verdict with a rule
    # that had too little history (`cold`) as well as its findings.
    record = judged(make_record("round-trip", queue_ms=400))
    assert record.verdict.cold and record.verdict.findings
    writer_side = open_store(postgres_dsn, clock=clock)
    try:
        writer_side.put(record)
        assert writer_side.writer.flush(timeout_s=FLUSH_S)
        assert writer_side.writer.stats.written == 1
    finally:
        assert writer_side.close()

    reader_clock = other_clock()
    reader = open_store(postgres_dsn, clock=reader_clock)   # another replica, or a restart
    try:
        assert len(reader.ring) == 0                         # so every read is the database's
        back = reader.get(record.trace_id)
        assert back is not None
        assert_same_record(back, reader_clock, record, clock)
        assert_same_record(reader.get_by_request_id("round-trip"), reader_clock, record, clock)
        start = clock.to_epoch_ns(record.start_ns)
        in_window = reader.window(start, start + 1, limit=10)
        assert [r.request_id for r in in_window] == ["round-trip"]
        assert reader.window(start + 1, start + MS, limit=10) == []
        overlapping = reader.overlapping(back.start_ns + MS, back.start_ns + 2 * MS)
        assert [r.request_id for r in overlapping] == ["round-trip"]
    finally:
        reader.close()
    # The lookup columns hold the same instants and the verdict's cause.
    assert rows_of(postgres_dsn, "request_id, trace_id, start_unix_ns, end_unix_ns, cause") == [
        ("round-trip", record.trace_id, clock.to_epoch_ns(record.start_ns),
         clock.to_epoch_ns(record.end_ns), record.verdict.cause)]


# -- 2. the fleet view --------------------------------------------------------------------

def test_a_replica_lists_and_draws_a_request_another_replica_finished(postgres_dsn):
    settings = ObservabilitySettings(store=postgres_dsn)
    obs_a = build_observability(settings, model_names=("m",))
    obs_b = build_observability(settings, model_names=("m",))
    try:
        t = obs_b.tracer
        start = time.perf_counter_ns()
        active = t.begin(request_id="on-b", model="m", operation="chat", traceparent=None,
                         start_ns=start)
        for i, stage in enumerate(SERVER_STAGES):
            active.timeline.mark(stage, start + (i + 1) * MS)
        active.timeline.emit(start + len(SERVER_STAGES) * MS)
        active.timeline.emit(start + (len(SERVER_STAGES) + 2) * MS)
        record = t.finish(active, end_ns=start + 15 * MS, finish_reason="stop",
                          num_prompt_tokens=12, num_output_tokens=2)
        assert obs_b.tracer.drain(10)
        assert obs_b.store.writer.flush(timeout_s=FLUSH_S)
        assert record.verdict is not None
        cause = record.verdict.cause
        assert obs_b.store.writer.stats.written == 1

        # Replica A never saw it: its ring is empty, the database has it.
        assert obs_a.store.ring.get(record.trace_id) is None
        seen = obs_a.store.get(record.trace_id)
        assert seen is not None and seen.request_id == "on-b"
        assert seen.verdict is not None and seen.verdict.cause == cause
        assert obs_a.clock.to_epoch_ns(seen.start_ns) == obs_b.clock.to_epoch_ns(start)
        listed = obs_a.store.window(None, None, limit=10)
        assert [r.request_id for r in listed] == ["on-b"]
        start_unix = obs_b.clock.to_epoch_ns(start)
        assert [r.request_id for r in obs_a.store.window(start_unix, start_unix + MS, limit=5,
                                                         order="slowest", model="m")] == ["on-b"]

        app = FastAPI()
        obs_a.include_routes(app)
        with TestClient(app) as http:
            response = http.get("/ui/api/requests")
            assert response.status_code == 200, response.text
            rows = [row for row in response.json()["requests"]
                    if row["trace_id"] == record.trace_id]
            assert len(rows) == 1
            assert rows[0]["cause"] == cause and rows[0]["request_id"] == "on-b"
            assert rows[0]["time_unix_ms"] == start_unix // MS
            assert rows[0]["server_ttft_ms"] == pytest.approx(len(SERVER_STAGES))

            response = http.get(f"/ui/api/trace/{record.trace_id}")
            assert response.status_code == 200, response.text
            view = response.json()
            assert view["request_id"] == "on-b" and view["verdict"]["cause"] == cause
            assert view["verdict"]["sentence"] == record.verdict.sentence()
            assert [s["stage"] for s in view["stages"]] == list(SERVER_STAGES)
            assert [s["duration_ms"] for s in view["stages"]] == \
                pytest.approx([1.0] * len(SERVER_STAGES))
            assert view["stages"][0]["start_ms"] == pytest.approx(0.0)
    finally:
        assert obs_b.close()
        assert obs_a.close()


# -- 3. updates reach the store -----------------------------------------------------------

def test_a_changed_client_is_persisted(postgres_dsn):
    clock = Clock()
    store = open_store(postgres_dsn, clock=clock)
    try:
        record = judged(make_record("persisted", client=None))
        record.client = None
        store.put(record)
        assert store.writer.flush(timeout_s=FLUSH_S)
        beacon = {"outcome": "ok", "client_ttft_ms": 31.0, "sdk": "openai",
                  "stages": [{"stage": "client.first_token", "start_ns": record.start_ns,
                              "end_ns": record.start_ns + 30 * MS}]}
        record.client = beacon
        store.persist(record)
        assert store.writer.flush(timeout_s=FLUSH_S)
    finally:
        assert store.close()
    reader_clock = other_clock()
    reader = open_store(postgres_dsn, clock=reader_clock)
    try:
        back = reader.get(record.trace_id)
        assert client_on_epoch(back.client, reader_clock) == client_on_epoch(beacon, clock)
    finally:
        reader.close()


def test_replace_changes_a_record_the_ring_no_longer_holds(postgres_dsn):
    clock = Clock()
    store = open_store(postgres_dsn, clock=clock, ring_capacity=1)
    try:
        first, second = make_record("first"), make_record("second")
        store.put(first)
        store.put(second)                  # evicts `first` from the ring of one
        assert store.writer.flush(timeout_s=FLUSH_S)
        assert store.ring.get_by_request_id("first") is None
        # Not held here: changed on the writer's thread (a database read the caller, the
        # event loop, must not make), so there is no record to hand back.
        assert store.replace("first", lambda r: dataclasses.replace(
            r, attrs={**r.attrs, "late_engine_span": "joined"}, finish_reason="length")) is None
        assert store.replace("never-stored", lambda r: r) is None
        assert store.writer.flush(timeout_s=FLUSH_S)
    finally:
        assert store.close()
    reader = open_store(postgres_dsn, clock=other_clock())
    try:
        back = reader.get_by_request_id("first")
        assert back.attrs == {"gen_ai.request.max_tokens": 64, "late_engine_span": "joined"}
        assert back.finish_reason == "length"
        assert reader.get_by_request_id("second").attrs == {"gen_ai.request.max_tokens": 64}
    finally:
        reader.close()
    assert rows_of(postgres_dsn) == [("first",), ("second",)]


# -- 4. PostgreSQL killed mid-load --------------------------------------------------------

def test_postgresql_killed_under_load_costs_only_counted_records(caplog):
    caplog.set_level(logging.WARNING, logger="ttftscope.store")
    max_pending = 200
    with PostgresServer(database="ttftscope") as pg:
        clock = Clock()
        sql = SqlStore(parse_store_url(pg.dsn))
        sql.open()
        # Which ids the database acknowledged, and which were in a write that failed: a
        # commit the kill cut after it reached the WAL is in the database though the
        # writer saw an error (and may have counted those records as dropped since).
        acked: set[str] = set()
        in_doubt: set[str] = set()
        upsert = sql.upsert

        def watched_upsert(rows):
            ids = {row[0] for row in rows}
            try:
                upsert(rows)
            except Exception:
                in_doubt.update(ids)
                raise
            acked.update(ids)
        sql.upsert = watched_upsert
        writer = StoreWriter(sql, clock, max_pending=max_pending, flush_interval_s=0.05)
        store = PersistentStore(sql, writer, clock, ring_capacity=1000)

        submitted: list[str] = []
        most_pending = [0]
        loaded = threading.Event()
        stop = threading.Event()
        failure: list[BaseException] = []

        def produce() -> None:
            try:
                n = 0
                while not stop.is_set():
                    for _ in range(10):
                        request_id = f"load-{n}"
                        n += 1
                        store.put(make_record(request_id))
                        submitted.append(request_id)
                        most_pending[0] = max(most_pending[0], writer.pending)
                    if n >= 300:
                        loaded.set()
                    # Pacing, not synchronisation: ~2,000 records a second is a continuous
                    # load without spinning one of the machine's cores.
                    stop.wait(0.005)
            except BaseException as exc:   # seen by the test's thread below
                failure.append(exc)

        producer = threading.Thread(target=produce, name="load", daemon=True)
        producer.start()
        try:
            assert loaded.wait(10)
            # The writer thread's progress: asynchronous, nothing to wait on but its count.
            assert wait_for(lambda: writer.stats.written > 0, 10)
            written_before = writer.stats.written
            pg.stop("immediate")
            # The writer noticing, and the bound being reached while the load goes on.
            assert wait_for(lambda: writer.stats.failed_writes > 0
                            and writer.stats.dropped["queue_full"] > 0, 15), writer.stats
            assert not writer.stats.up
            written_while_down = writer.stats.written
            pg.start()
            # No flush here (a flush would wake the writer from its back-off): it must come
            # back by itself, within its longest back-off.
            assert wait_for(lambda: writer.stats.written > written_while_down, 15), \
                writer.stats
        finally:
            stop.set()
            producer.join(10)
        assert not producer.is_alive() and not failure, failure
        assert writer.flush(timeout_s=FLUSH_S)
        stats = writer.stats
        try:
            assert stats.up and stats.failed_writes > 0
            assert written_before > 0 and written_while_down >= written_before
            assert most_pending[0] <= max_pending          # the bound held throughout
            assert writer.pending == 0
            dropped = sum(stats.dropped.values())
            assert stats.dropped["queue_full"] > 0 and stats.dropped["encode_failed"] == 0
            assert stats.written + dropped == len(submitted)
            in_database = {row[0] for row in rows_of(pg.dsn)}
            assert len(in_database) == len(rows_of(pg.dsn))
            assert len(acked) == stats.written
            assert acked <= in_database                   # every acknowledged write is kept
            assert in_database - acked <= in_doubt        # and only those, or a cut commit's
            assert in_database <= set(submitted)
            # Every record is in the database or counted as dropped.
            assert len(set(submitted) - in_database) <= dropped
            assert len(in_database) >= stats.written
        finally:
            writer.close(10)
    warnings = [r for r in caplog.records
                if r.name == "ttftscope.store" and r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 3, [r.getMessage() for r in warnings]
    assert dropped > 10 * len(warnings)                  # once per interval, not per record
    assert all(pg.dsn in r.getMessage() for r in warnings)


# -- 5. wrong DSN, password, unreachable --------------------------------------------------

def _store_error(url: str) -> StoreError:
    with pytest.raises(StoreError) as info:
        store = open_store(url, clock=Clock())
        store.close()
    return info.value


def test_a_wrong_password_is_refused_without_showing_it():
    with PostgresServer(database="ttftscope") as pg:
        pg.set_password("postgres", "right-Secret-7")
        pg.require_password()
        right = pg.dsn_for(password="right-Secret-7")
        wrong = pg.dsn_for(password="wrong-Secret-9")
        error = _store_error(wrong)
        message = str(error)
        assert parse_store_url(wrong).redacted in message, message
        assert "postgres:***@127.0.0.1" in message
        assert "password authentication failed" in message
        assert "wrong-Secret-9" not in message and "right-Secret-7" not in message
        # The same server and user with the right password: the password was the reason.
        store = open_store(right, clock=Clock())
        try:
            assert schema_version_of(right) == SCHEMA_VERSION
        finally:
            store.close()


def test_a_port_nobody_listens_on_is_refused():
    url = f"postgresql://postgres:pw-Secret-3@127.0.0.1:{free_port()}/ttftscope"
    message = str(_store_error(url))
    assert parse_store_url(url).redacted in message and "pw-Secret-3" not in message
    assert "refused" in message.lower(), message


def test_a_database_that_does_not_exist_is_named(postgres_server):
    url = postgres_server.dsn_for("no_such_db", password="pw-Secret-4")
    message = str(_store_error(url))
    assert parse_store_url(url).redacted in message and "pw-Secret-4" not in message
    assert "no_such_db" in message and "does not exist" in message, message


class SilentServer:
    """A loopback TCP server that accepts connections and never says a word."""

    def __enter__(self) -> SilentServer:
        self.sock = socket.create_server(("127.0.0.1", 0))
        # accept() with a short timeout, so the thread sees `stop`: closing a listening
        # socket does not wake an accept() already blocked on it.
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="silent", daemon=True)
        self.thread.start()
        return self

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()
        for conn in self.accepted:
            conn.close()
        self.sock.close()


def test_a_server_that_never_answers_fails_within_the_connect_timeout():
    with SilentServer() as silent:
        url = parse_store_url(f"postgresql://postgres:pw-Secret-5@127.0.0.1:{silent.port}/t")
        sql = SqlStore(url, connect_timeout_s=2)
        outcome: list[BaseException | None] = []

        def attempt() -> None:
            try:
                sql.open()
                outcome.append(None)
            except BaseException as exc:   # looked at by the test's thread
                outcome.append(exc)

        # On a thread, so a store that never gave up fails this test instead of hanging it.
        opener = threading.Thread(target=attempt, name="open", daemon=True)
        opener.start()
        opener.join(60)
        assert not opener.is_alive(), "open() did not give up on a server that never answers"
        assert silent.accepted, "the connection never reached the silent server"
    error, = outcome
    assert isinstance(error, StoreError), error
    message = str(error)
    assert url.redacted in message and "pw-Secret-5" not in message
    assert "timeout" in message.lower(), message


# -- 6. schema versions -------------------------------------------------------------------

def _make_version_1(dsn: str, records: list[RequestRecord], clock: Clock) -> None:
    """A store as version 1 of the schema left it, with `records` in it."""
    with psycopg.connect(dsn, connect_timeout=CONNECT_S, autocommit=True) as conn:
        conn.execute("CREATE TABLE ttftscope_schema (version INTEGER NOT NULL)")
        for statement in migrations(POSTGRESQL)[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO ttftscope_schema (version) VALUES (1)")
        for r in records:
            conn.execute(
                "INSERT INTO records (request_id, trace_id, model, start_unix_ns, "
                "end_unix_ns, ttft_ns, doc) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (r.request_id, r.trace_id, r.model, clock.to_epoch_ns(r.start_ns),
                 clock.to_epoch_ns(r.end_ns), r.ttft_ns, encode(r, clock)))


def test_a_version_1_store_is_migrated_and_its_causes_backfilled(postgres_dsn, caplog):
    caplog.set_level(logging.INFO, logger="ttftscope.store")
    clock = Clock()
    old = judged(make_record("v1-judged"))
    unjudged = make_record("v1-no-verdict")
    _make_version_1(postgres_dsn, [old, unjudged], clock)
    assert schema_version_of(postgres_dsn) == 1

    reader_clock = other_clock()
    store = open_store(postgres_dsn, clock=reader_clock)
    try:
        assert schema_version_of(postgres_dsn) == SCHEMA_VERSION == 2
        assert rows_of(postgres_dsn, "request_id, cause") == [
            ("v1-judged", old.verdict.cause), ("v1-no-verdict", None)]
        assert_same_record(store.get(old.trace_id), reader_clock, old, clock)
        assert_same_record(store.get(unjudged.trace_id), reader_clock, unjudged, clock)
        # Version 2's index answers the slowest in a window, over the old rows too.
        start = clock.to_epoch_ns(min(old.start_ns, unjudged.start_ns))
        slowest = store.window(start, start + DAY_NS, limit=5, order="slowest")
        assert {r.request_id for r in slowest} == {"v1-judged", "v1-no-verdict"}
        # Writing a new record on the migrated store works as on a new one.
        store.put(judged(make_record("v2-new")))
        assert store.writer.flush(timeout_s=FLUSH_S) and store.writer.stats.written == 1
    finally:
        store.close()
    assert any("migrated to schema version 2" in r.getMessage() for r in caplog.records)
    # Opening again migrates nothing more.
    open_store(postgres_dsn, clock=Clock()).close()
    with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_S) as conn:
        versions = conn.execute("SELECT version FROM ttftscope_schema "
                                "ORDER BY version").fetchall()
    assert versions == [(1,), (2,)]


def test_a_version_1_store_with_hostile_documents_is_migrated(postgres_dsn):
    """Version 1 stored the same ASCII JSON documents: a NUL or a lone surrogate in an
    attribute travels as a \\u escape, which the backfill must not choke on (a migration
    that fails fails every start)."""
    clock = Clock()
    lone = b"\xff\xfe".decode("utf-8", "surrogateescape")
    # NUL, and text that merely looks like escapes: a backslash then u0000, an emoji
    # (a surrogate pair in ASCII JSON), a backslash before a real NUL.
    nul = judged(make_record("v1-nul", attrs={"a": "x\x00y", "b": "\\u0000 \\udcff",
                                              "c": "\N{GRINNING FACE}", "d": "\\\x00"}))
    surrogate = judged(make_record("v1-lone", attrs={"a": lone},
                                   client={"sdk": lone, "stages": []}))
    _make_version_1(postgres_dsn, [nul, surrogate], clock)
    store = open_store(postgres_dsn, clock=clock)
    try:
        assert schema_version_of(postgres_dsn) == SCHEMA_VERSION
        assert rows_of(postgres_dsn, "request_id, cause") == [
            ("v1-lone", surrogate.verdict.cause), ("v1-nul", nul.verdict.cause)]
        assert store.get(nul.trace_id).attrs == nul.attrs
        back = store.get(surrogate.trace_id)
        assert back.attrs == {"a": lone} and back.client == {"sdk": lone, "stages": []}
    finally:
        store.close()


def test_a_store_newer_than_this_code_is_refused(postgres_dsn):
    with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_S, autocommit=True) as conn:
        conn.execute("CREATE TABLE ttftscope_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO ttftscope_schema (version) VALUES (%s)",
                     (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreVersionError) as info:
        open_store(postgres_dsn, clock=Clock()).close()
    message = str(info.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message, message
    assert re.search(rf"\bversion {SCHEMA_VERSION}\b", message), message
    assert parse_store_url(postgres_dsn).redacted in message
    # Refused, not "repaired": nothing was created or recorded.
    assert schema_version_of(postgres_dsn) == SCHEMA_VERSION + 1
    with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_S) as conn:
        assert conn.execute("SELECT to_regclass('public.records')").fetchone() == (None,)


# -- 7. hostile strings -------------------------------------------------------------------

QUOTES = "'\"; DROP TABLE records; --"
NUL = "nul\x00byte"
LONE = b"\xff\xfe".decode("utf-8", "surrogateescape")
MEGABYTE = (QUOTES + NUL + LONE + "x" * 64) * (2**20 // 100)


def test_hostile_strings_are_stored_as_data(postgres_dsn):
    assert len(MEGABYTE) > 2**20 - 200
    hostile = {
        "quotes": make_record(QUOTES, model=QUOTES, attrs={"q": QUOTES, QUOTES: QUOTES},
                              client={"sdk": QUOTES, "stages": []}),
        "nul": make_record("id-" + NUL, model=NUL, attrs={"nul": NUL, NUL: "key"},
                           client={"sdk": NUL}),
        "lone": make_record("id-" + LONE, model=LONE, attrs={"lone": LONE, LONE: "key"},
                            client={"sdk": LONE}),
        "big": make_record("big-" + MEGABYTE, model=MEGABYTE,
                           attrs={"big": MEGABYTE, "small": "kept"},
                           client={"sdk": MEGABYTE}),
        # Not a trace id at all, as a broken collector might send one.
        "trace": make_record("hostile-trace", trace_id=QUOTES + NUL + LONE),
    }
    for record in hostile.values():
        judged(record)
    clock = Clock()
    store = open_store(postgres_dsn, clock=clock)
    try:
        for record in hostile.values():
            store.put(record)
        assert store.writer.flush(timeout_s=FLUSH_S)
        stats = store.writer.stats
        assert stats.written == len(hostile) and sum(stats.dropped.values()) == 0
        assert stats.failed_writes == 0
    finally:
        assert store.close()

    # The table is intact, with one row each.
    with psycopg.connect(postgres_dsn, connect_timeout=CONNECT_S) as conn:
        assert conn.execute("SELECT to_regclass('public.records') IS NOT NULL, "
                            "(SELECT count(*) FROM records)").fetchone() == (True, len(hostile))
        assert conn.execute("SELECT max(version) FROM ttftscope_schema").fetchone() == \
            (SCHEMA_VERSION,)
        longest_doc, = conn.execute("SELECT max(length(doc)) FROM records").fetchone()
    assert longest_doc <= MAX_DOC_BYTES

    reader_clock = other_clock()
    reader = open_store(postgres_dsn, clock=reader_clock)
    try:
        for name, record in hostile.items():
            back = reader.get(record.trace_id)
            assert back is not None, name
            assert reader.get_by_request_id(record.request_id).trace_id == record.trace_id
            assert [r.request_id for r in reader.window(None, None, limit=10,
                                                        model=record.model)] == \
                [back.request_id], name
            assert back.verdict.cause == record.verdict.cause
            if name == "big":
                continue
            assert_same_record(back, reader_clock, record, clock)
            assert TRUNCATED_ATTR not in back.attrs
        big = reader.get(hostile["big"].trace_id)
        # Cut per the codec's rules, and marked: long strings to CUT_STRING_CHARS.
        assert big.attrs == {"big": MEGABYTE[:CUT_STRING_CHARS], "small": "kept",
                             TRUNCATED_ATTR: True}
        assert big.client == {"sdk": MEGABYTE[:CUT_STRING_CHARS]}
        assert big.request_id == ("big-" + MEGABYTE)[:CUT_STRING_CHARS]
        assert big.model == MEGABYTE[:CUT_STRING_CHARS]
        assert big.trace_id == hostile["big"].trace_id
        assert [s.duration_ns for s in big.stages] == [MS] * len(SERVER_STAGES)
        assert len(reader.window(None, None, limit=100)) == len(hostile)
    finally:
        reader.close()


# -- 8. retention -------------------------------------------------------------------------

def test_trim_deletes_what_is_older_than_max_age_then_the_oldest_past_max_bytes(postgres_dsn):
    clock = Clock()
    now = time.perf_counter_ns()
    old = [make_record(f"old-{i}", base_ns=now - 10 * DAY_NS - i * MS) for i in range(5)]
    new = [make_record(f"new-{i}", base_ns=now - i * MS) for i in range(5)]
    # The writer's own retention keeps everything here: this test's trims do the work.
    store = open_store(postgres_dsn, clock=clock,
                       retention=Retention(max_age_s=1000 * 86_400, max_bytes=None))
    try:
        for record in old + new:
            store.put(record)
        assert store.writer.flush(timeout_s=FLUSH_S)
        assert store.sql.count() == 10
        size = store.sql.size_bytes()
        assert size > 0
        assert store.sql.oldest_end_unix_ns() == clock.to_epoch_ns(old[-1].end_ns)

        deleted = store.sql.trim(older_than_unix_ns=time.time_ns() - 7 * DAY_NS,
                                 max_bytes=None)
        assert deleted == 5
        assert rows_of(postgres_dsn) == [(f"new-{i}",) for i in range(5)]
        assert store.sql.size_bytes() > 0
        # Past max_bytes, the oldest go: 1 - 0.9 * (size/2) / size of the 5, rounded up.
        deleted = store.sql.trim(older_than_unix_ns=time.time_ns() - 7 * DAY_NS,
                                 max_bytes=store.sql.size_bytes() // 2)
        assert deleted == 3
        assert rows_of(postgres_dsn) == [("new-0",), ("new-1",)]
        assert store.sql.size_bytes() > 0
    finally:
        store.close()


def test_the_writer_applies_retention_by_itself(postgres_dsn):
    clock = Clock()
    now = time.perf_counter_ns()
    store = open_store(postgres_dsn, clock=clock, flush_interval_s=0.05,
                       retention=Retention(max_age_s=7 * 86_400, max_bytes=None),
                       retention_interval_s=0.1)
    try:
        for i in range(4):
            store.put(make_record(f"old-{i}", base_ns=now - 8 * DAY_NS - i * MS))
        store.put(make_record("new", base_ns=now))
        assert store.writer.flush(timeout_s=FLUSH_S)
        # The writer thread trims on its own schedule: asynchronous, awaited by its count.
        assert wait_for(lambda: store.writer.stats.trimmed >= 4, 10), store.writer.stats
        assert rows_of(postgres_dsn) == [("new",)]
        assert wait_for(lambda: (store.writer.stats.size_bytes or 0) > 0, 10)
    finally:
        store.close()
