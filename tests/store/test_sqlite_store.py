"""The default store, an SQLite file: records survive a restart and read the same from
every view; schema versions; a corrupt file, a locked or full one, two processes on one
file; retention; hostile strings. Real SQLite, real files, a real tmpfs for the full disk."""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from store_support import MODEL, finish_request, wait_for
from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord
from tracer.store import codec
from tracer.store.open import open_store
from tracer.store.persistent import PersistentStore
from tracer.store.schema import SCHEMA_VERSION, SQLITE, StoreVersionError, migrations
from tracer.store.database import WAL_LIMIT_BYTES
from tracer.store.sql import SqlStore
from tracer.store.url import parse_store_url
from tracer.store.writer import Retention, StoreWriter
from tracer.web.observability import ObservabilitySettings, build_observability

REPO = Path(__file__).resolve().parents[2]


def _obs(path: Path):
    return build_observability(ObservabilitySettings(store=f"sqlite:///{path}"),
                               model_names=(MODEL,))


def _client(obs) -> TestClient:
    app = FastAPI()
    obs.include_routes(app)
    return TestClient(app)


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT count(*) FROM records").fetchone()[0]


def test_records_survive_a_restart_with_their_verdicts(tmp_path):
    path = tmp_path / "records.sqlite3"
    first = _obs(path)
    traces = [finish_request(first, i) for i in range(12)]
    assert first.tracer.drain(10)
    before = _client(first).get(f"/ui/api/trace/{traces[-1]}").json()
    assert first.close()
    assert _rows(path) == 12

    second = _obs(path)   # a new process's clock, an empty ring
    assert len(second.store.ring) == 0
    client = _client(second)
    listed = client.get("/ui/api/requests?limit=50").json()["requests"]
    assert [r["trace_id"] for r in listed] == traces[::-1]
    after = client.get(f"/ui/api/trace/{traces[-1]}").json()
    assert after["time_unix_ms"] == before["time_unix_ms"]
    assert [(s["stage"], s["duration_ms"]) for s in after["stages"]] == \
        [(s["stage"], s["duration_ms"]) for s in before["stages"]]
    assert after["verdict"]["cause"] == before["verdict"]["cause"] is not None
    assert listed[0]["cause"] == before["verdict"]["cause"]
    second.close()


def test_baselines_come_back_after_a_restart(tmp_path):
    path = tmp_path / "records.sqlite3"
    first = _obs(path)
    for i in range(10):
        finish_request(first, i, ttft_ms=20.0)
    first.close()
    second = _obs(path)
    with second.diagnoser.baselines.lock:
        baseline = second.diagnoser.baselines.of(MODEL)
        assert baseline.median("ttft") == pytest.approx(20e6, rel=0.01)
        # ... while "this process is new" still holds for the cold-path rule.
        assert baseline.num_requests == 0
    second.close()


def test_the_ui_reads_take_a_time_range_and_the_slowest_first(tmp_path):
    obs = _obs(tmp_path / "r.sqlite3")
    ttfts = [30.0, 90.0, 10.0, 60.0]
    traces = [finish_request(obs, i, ttft_ms=t) for i, t in enumerate(ttfts)]
    obs.tracer.drain(10)
    obs.store.writer.flush()
    client = _client(obs)
    slowest = client.get("/ui/api/requests?order=slowest&limit=2").json()["requests"]
    assert [r["trace_id"] for r in slowest] == [traces[1], traces[3]]
    times = [r["time_unix_ms"] for r in client.get("/ui/api/requests").json()["requests"]]
    lo = min(times)
    window = client.get(f"/ui/api/requests?from_unix_ms={lo}&to_unix_ms={lo + 1}").json()
    assert all(lo <= r["time_unix_ms"] < lo + 1 for r in window["requests"])
    assert 1 <= len(window["requests"]) <= 4
    empty = client.get("/ui/api/requests?from_unix_ms=1000&to_unix_ms=2000").json()
    assert empty["requests"] == []
    diagnosis = client.get(f"/ui/api/diagnosis?from_unix_ms={lo}").json()
    assert diagnosis["num_requests"] == 4 and diagnosis["from_unix_ms"] == lo
    for bad in ("order=fastest", "from_unix_ms=abc", "from_unix_ms=5&to_unix_ms=4",
                f"model={'x' * 300}"):
        response = client.get(f"/ui/api/requests?{bad}")
        assert response.status_code == 400, bad
        assert response.json()["error"]["type"] == "invalid_request_error"
    obs.close()


def test_a_sigkill_loses_at_most_the_stated_window(tmp_path):
    """The child finishes a request every ~2 ms and says when; once it has run for 2 s it
    is killed. Every request it finished more than 1.5 s (the stated window) before the kill
    is in the file."""
    path = tmp_path / "records.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests/store'}"})
    finished: list[tuple[str, int]] = []
    try:
        for line in child.stdout:
            request_id, unix_ns = line.split()
            finished.append((request_id, int(unix_ns)))
            if finished[-1][1] - finished[0][1] >= 2_000_000_000:
                break
    finally:
        child.kill()
        child.wait(30)
    import time
    killed_ns = time.time_ns()
    assert len(finished) > 100, child.stderr.read()
    with sqlite3.connect(path) as conn:
        stored = {row[0] for row in conn.execute("SELECT request_id FROM records")}
    due = [rid for rid, t in finished if t <= killed_ns - 1_500_000_000]
    assert due and not set(due) - stored
    assert stored <= {rid for rid, _ in finished}


_CHILD = """
import sys, time
from store_support import finish_request
from tracer.web.observability import ObservabilitySettings, build_observability
obs = build_observability(ObservabilitySettings(store="sqlite:///" + sys.argv[1]),
                          model_names=("m",))
for i in range(100_000):
    finish_request(obs, i)
    print(f"req-{i}", time.time_ns(), flush=True)
    time.sleep(0.002)   # the load's pace, not a synchronisation
"""


def _store_at_version_1(path: Path, doc: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE ttftscope_schema (version INTEGER NOT NULL)")
        for statement in migrations(SQLITE)[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO ttftscope_schema VALUES (1)")
        conn.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
                     ("req-old", "a" * 32, MODEL, 1, 2, 5, doc))


def test_a_version_1_store_is_migrated_and_its_records_kept(tmp_path):
    from tracer.core.diagnoser import Diagnoser
    path = tmp_path / "old.sqlite3"
    record = RequestRecord("req-old", "a" * 32, "b" * 16, MODEL, "chat", 0, 2, ttft_ns=5)
    Diagnoser().publish(record)
    _store_at_version_1(path, codec.encode(record, Clock()))
    # The old row is dated 1970: a retention that keeps it, or the writer's first pass,
    # which runs at once, may trim it before it is read.
    store = open_store(f"sqlite:///{path}", clock=Clock(),
                       retention=Retention(max_age_s=1e12, max_bytes=None))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT max(version) FROM ttftscope_schema").fetchone()[0] == \
            SCHEMA_VERSION
        assert conn.execute("SELECT cause FROM records").fetchone()[0] == \
            record.verdict.cause is not None
    assert store.get("a" * 32).verdict.cause == record.verdict.cause
    store.close()


def test_a_newer_store_is_refused_with_both_versions_named(tmp_path):
    path = tmp_path / "new.sqlite3"
    open_store(f"sqlite:///{path}", clock=Clock()).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO ttftscope_schema VALUES (?)", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreVersionError, match=f"version {SCHEMA_VERSION + 1}.*up to version "
                       f"{SCHEMA_VERSION}"):
        open_store(f"sqlite:///{path}", clock=Clock())


def test_the_command_says_so_in_one_line(tmp_path):
    path = tmp_path / "new.sqlite3"
    open_store(f"sqlite:///{path}", clock=Clock()).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO ttftscope_schema VALUES (?)", (SCHEMA_VERSION + 1,))
    run = subprocess.run([sys.executable, "-m", "tracer", "proxy", "--upstream",
                          "http://127.0.0.1:9", "--served-model-name", "m", "--store",
                          f"sqlite:///{path}"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2
    assert "upgrade ttftscope" in run.stderr and "Traceback" not in run.stderr


def test_a_corrupt_file_is_set_aside_and_a_fresh_one_started(tmp_path, caplog):
    path = tmp_path / "records.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING, logger="ttftscope.store"):
        store = open_store(f"sqlite:///{path}", clock=Clock())
    assert store.sql.set_aside is not None and store.sql.set_aside.read_bytes().startswith(
        b"this is not a database")
    assert "moved to" in caplog.text
    store.put(RequestRecord("r", "c" * 32, "d" * 16, MODEL, "chat", 0, 1, ttft_ns=1))
    assert store.writer.flush() and _rows(path) == 1
    store.close()
    open_store(f"sqlite:///{path}", clock=Clock()).close()   # and it opens again as is


_WRITER = """
import sys
from store_support import finish_request
from tracer.web.observability import ObservabilitySettings, build_observability
obs = build_observability(ObservabilitySettings(store="sqlite:///" + sys.argv[1]),
                          model_names=("m",))
for i in range(int(sys.argv[3])):
    finish_request(obs, f"{sys.argv[2]}-{i}")
assert obs.close(60)
"""


def test_two_processes_on_one_file_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite3"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests/store'}"}
    children = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), name, "300"],
                                 cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
                for name in ("a", "b")]
    for child in children:
        assert child.wait(120) == 0, child.stderr.read()
    with sqlite3.connect(path) as conn:
        ids = {row[0] for row in conn.execute("SELECT request_id FROM records")}
    assert ids == {f"req-{name}-{i}" for name in ("a", "b") for i in range(300)}


def _writer(path: Path, **kwargs) -> tuple[SqlStore, StoreWriter, PersistentStore]:
    sql = SqlStore(parse_store_url(f"sqlite:///{path}"), statement_timeout_s=0.05)
    sql.open()
    clock = Clock()
    writer = StoreWriter(sql, clock, flush_interval_s=0.02, **kwargs)
    return sql, writer, PersistentStore(sql, writer, clock)


def _record(i: int, **kwargs) -> RequestRecord:
    return RequestRecord(f"r{i}", f"{i + 1:032x}", "1" * 16, MODEL, "chat", i, i + 1,
                         ttft_ns=1, **kwargs)


def test_a_locked_database_costs_only_what_the_bound_says_and_writing_resumes(tmp_path,
                                                                                caplog):
    path = tmp_path / "locked.sqlite3"
    sql, writer, store = _writer(path, max_pending=50)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")        # another process holding the file
    with caplog.at_level(logging.WARNING, logger="ttftscope.store"):
        for i in range(80):
            store.put(_record(i))
        assert writer.pending <= 50
        assert not writer.flush(timeout_s=0.5)   # nothing can be written yet
        blocker.execute("ROLLBACK")
        assert writer.flush(timeout_s=30)
    stats = writer.stats
    # 30 past the bound: refused at the door, or dropped from a failed batch to make room
    # (which, depends on when the writer's retries fell); never more, never fewer.
    assert stats.failed_writes > 0
    assert stats.dropped["queue_full"] + stats.dropped["write_failed"] == 30
    assert stats.written == 50 == _rows(path)
    assert caplog.text.count("store sqlite") <= 4     # on a change, and once per interval
    store.put(_record(100))
    assert writer.flush(10) and _rows(path) == 51
    store.close()


def test_an_idle_writer_sleeps_until_a_record_comes_and_then_writes_it(tmp_path):
    """No timer wakes a writer with nothing to write (a timer's expiry costs the thread
    ~0.1 ms of CPU on a small VM: bench/wake_cost.py): it sleeps until the next trim, or the
    next log line owed, and a record wakes it; that record is written one flush interval
    later, nobody calling `flush`."""
    path = tmp_path / "idle.sqlite3"
    sql, writer, store = _writer(path, retention_interval_s=3600.0)
    store.put(_record(0))
    # The writer's thread, after the first write and trim: nothing to wait on but polling.
    assert wait_for(lambda: writer._idle and writer.stats.written == 1, 10)
    assert 3500 < writer._idle_wait_s() <= 3600         # asleep until the next trim
    store.put(_record(1))
    assert wait_for(lambda: writer.stats.written == 2, 10)   # woken by the record
    assert _rows(path) == 2
    writer._unlogged_drops = 1                          # a drop to report: the log's interval
    assert writer._idle_wait_s() <= 10.0
    store.close()


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True,
                   timeout=30)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)


def test_a_full_disk_is_counted_and_writing_resumes_once_there_is_room(tiny_disk, caplog):
    path = tiny_disk / "records.sqlite3"
    sql, writer, store = _writer(path, max_pending=40, batch_size=10)
    store.put(_record(0))
    assert writer.flush(10)
    # Everything else on the disk but ~64 kB taken by someone else's file.
    ballast = tiny_disk / "ballast"
    free = os.statvfs(tiny_disk).f_bavail * os.statvfs(tiny_disk).f_frsize
    ballast.write_bytes(b"\0" * (free - 64 * 1024))
    pad = {"note": "x" * 8_000}
    with caplog.at_level(logging.WARNING, logger="ttftscope.store"):
        for i in range(1, 101):
            store.put(_record(i, attrs=dict(pad)))
        assert writer.pending <= 40
        assert not writer.flush(timeout_s=1)          # the disk is full
        assert writer.stats.failed_writes > 0 and not writer.stats.up
        ballast.unlink()                              # an operator makes room
        assert writer.flush(timeout_s=30)             # ... and writing resumes by itself
    stats = writer.stats
    assert stats.up and stats.written + stats.dropped["queue_full"] + \
        stats.dropped["write_failed"] == 101
    assert _rows(path) == stats.written
    assert "database or disk is full" in caplog.text
    assert "writing again" in caplog.text
    assert caplog.text.count("store sqlite") <= 4     # on a change, and once per interval
    store.close()


def test_retention_by_age_and_by_size(tmp_path):
    path = tmp_path / "r.sqlite3"
    sql, writer, store = _writer(path)
    clock = writer.clock
    now_ns = clock.to_epoch_ns(0)
    for i in range(200):
        store.put(_record(i, attrs={"pad": "y" * 2000}))
    writer.flush()
    assert sql.trim(older_than_unix_ns=now_ns - 1, max_bytes=None) == 0
    cut = clock.to_epoch_ns(100)   # records 0..98 ended before it
    assert sql.trim(older_than_unix_ns=cut, max_bytes=None) == 99
    assert _rows(path) == 101
    size = sql.size_bytes()
    deleted = sql.trim(older_than_unix_ns=0, max_bytes=size // 2)
    assert deleted > 0 and sql.size_bytes() <= size // 2
    # ... and the WAL is cut back, so the file on disk follows (journal_size_limit).
    assert os.path.getsize(f"{path}-wal") <= WAL_LIMIT_BYTES
    assert sql.file_bytes() <= size // 2 + WAL_LIMIT_BYTES + 65536
    remaining = [r[0] for r in sqlite3.connect(path).execute(
        "SELECT request_id FROM records ORDER BY end_unix_ns")]
    assert remaining == [f"r{i}" for i in range(200 - len(remaining), 200)]  # oldest went
    store.close()


HOSTILE = ["'\"; DROP TABLE records; --", "nul\x00byte", "x" * (1 << 20),
           b"\xff\xfe".decode("utf-8", "surrogateescape"), "emoji 🚀"]


@pytest.mark.parametrize("value", HOSTILE, ids=["quotes", "nul", "1mb", "invalid-utf8", "emoji"])
def test_hostile_strings_are_stored_as_values(tmp_path, value):
    path = tmp_path / "h.sqlite3"
    sql, writer, store = _writer(path)
    record = RequestRecord(value, "e" * 32, "f" * 16, value, "chat", 0, 1, ttft_ns=1,
                           attrs={"k": value, value[:50]: 1}, client={"sdk": value})
    store.put(record)
    assert writer.flush() and writer.stats.written == 1
    reader = open_store(f"sqlite:///{path}", clock=Clock())
    back = reader.get("e" * 32)
    assert back is not None and reader.get_by_request_id(value) is not None
    if len(value) > codec.MAX_DOC_BYTES:
        assert back.attrs[codec.TRUNCATED_ATTR] is True
        assert back.attrs["k"] == value[:codec.CUT_STRING_CHARS]
    else:
        assert back.attrs["k"] == value and back.client["sdk"] == value
        assert back.model == value
    assert _rows(path) == 1   # the table is intact
    reader.close()
    store.close()


def test_a_store_metric_family_for_every_fact(tmp_path):
    from prometheus_client import generate_latest
    obs = _obs(tmp_path / "m.sqlite3")
    finish_request(obs, 1)
    obs.tracer.drain(10)
    obs.store.writer.flush()
    obs.store.writer._trim()   # the retention pass measures the store for the gauges
    text = generate_latest(obs.registry).decode()
    for line in ('ttftscope_store_records_written_total{backend="sqlite"} 1.0',
                 'ttftscope_store_records_dropped_total{backend="sqlite",reason="queue_full"} 0.0',
                 'ttftscope_store_up{backend="sqlite"} 1.0',
                 'ttftscope_store_pending_records{backend="sqlite"} 0.0'):
        assert line in text
    assert 'ttftscope_store_size_bytes{backend="sqlite"}' in text
    assert 'ttftscope_store_oldest_record_age_seconds{backend="sqlite"}' in text
    obs.close()


class _Unreachable:
    """A database that fails every call, as one that is down does (after its time-out),
    and says which were made."""

    def __init__(self, url) -> None:
        self.url = url
        self.calls: list[str] = []

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            if threading.current_thread().name != "ttftscope-store":   # the writer may
                self.calls.append(name)
            raise OSError("connection refused")
        return fail


def test_the_event_loops_lookups_and_the_diagnosis_never_read_the_database(tmp_path):
    """A beacon join, a late span's replace and the diagnosis' neighbours run where a slow
    or absent database must not reach (the event loop, the tracer's worker): they read this
    process's records only. The /ui's reads (off the loop) go to it, and fall back."""
    obs = _obs(tmp_path / "r.sqlite3")
    trace = finish_request(obs, 1)
    obs.tracer.drain(10)
    store = obs.store
    real_sql = store.sql
    store.sql = down = _Unreachable(real_sql.url)
    try:
        assert store.get_local(trace) is not None
        assert store.get_local("f" * 32) is None
        assert store.replace("no-such-request", lambda r: r) is None
        record = store.get_local(trace)
        assert obs.neighbourhood.neighbours_of(record, recent_only=True) == []
        finish_request(obs, 2)           # judged on the worker, its neighbours asked
        assert obs.tracer.drain(10)
        assert down.calls == []
        failures = store.read_failures
        assert len(obs.neighbourhood.occupancies(record.start_ns, record.end_ns)[0]) >= 1
        assert down.calls == ["overlapping"] and store.read_failures == failures + 1
    finally:
        store.sql = real_sql
    obs.close()


def test_a_document_is_the_json_of_asdict_for_the_gaps_and_the_verdict():
    """The codec writes the gap summary and the verdict from field names read once: the
    same JSON as `dataclasses.asdict`'s deep copies; an evidence value json cannot write as
    it stands still goes through asdict."""
    import dataclasses

    from tracer.record.emits import GapSummary
    from tracer.record.rule_outcome import Finding, Unjudged
    from tracer.record.verdict import Verdict

    @dataclasses.dataclass
    class Odd:
        n: int

    def reference(verdict):
        doc = {f.name: getattr(verdict, f.name) for f in dataclasses.fields(verdict)}
        doc["findings"] = [dataclasses.asdict(f) for f in verdict.findings]
        doc["cold"] = [dataclasses.asdict(u) for u in verdict.cold]
        return json.loads(json.dumps(doc, default=str))

    clock = Clock(wall_ns=10**18, perf_ns=0)
    for evidence in ({"queue_ms": 6.5, "culprit_trace_id": "ab" * 16, "n": 3, "x": None},
                     {"odd": Odd(1), "list": [1, 2]}):
        verdict = Verdict("queueing", 5_000_000, evidence,
                          (Finding("queueing", 5_000_000, dict(evidence), True),
                           Finding("long_prompt", None)),
                          9_000_000, engine="vllm", cold=(Unjudged("prefill", 3),),
                          history_samples=40)
        record = RequestRecord("r", "1" * 32, "2" * 16, "m", "chat", 5, 9, ttft_ns=3,
                               itl=GapSummary.of((1_000, 3_000, 2_000)), verdict=verdict)
        doc = json.loads(codec.encode(record, clock))
        assert doc["itl"] == json.loads(json.dumps(dataclasses.asdict(record.itl)))
        assert doc["verdict"] == reference(verdict)
        assert list(doc["verdict"]) == [f.name for f in dataclasses.fields(Verdict)]
        back = codec.decode(codec.encode(record, clock), clock)
        assert back.itl == record.itl and back.verdict.findings[0].cause == "queueing"


def test_a_late_change_to_a_record_the_ring_let_go_reaches_the_file(tmp_path):
    sql, writer, store = _writer(tmp_path / "late.sqlite3")
    store.ring = type(store.ring)(1, clock=store.clock)      # a ring of one
    store.put(_record(1))
    store.put(_record(2))                                    # lets record 1 go
    assert writer.flush()
    assert store.replace("r1", lambda r: RequestRecord(
        r.request_id, r.trace_id, r.span_id, r.model, r.operation, r.start_ns, r.end_ns,
        ttft_ns=r.ttft_ns, attrs={"late": "span"})) is None   # changed on the writer's thread
    assert store.replace("never", lambda r: r) is None
    assert writer.flush()
    reader = open_store(f"sqlite:///{tmp_path / 'late.sqlite3'}", clock=Clock())
    assert reader.get_by_request_id("r1").attrs == {"late": "span"}
    assert reader.get_by_request_id("never") is None
    reader.close()
    assert writer.stats.dropped == dict.fromkeys(writer.stats.dropped, 0)
    store.close()
