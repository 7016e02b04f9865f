"""The record store (tracer/store/) on this machine: write cost, size, reads at scale, the
serving thread, and a soak.

    .venv/bin/python bench/store_bench.py                       # ~2-4 min on 2 cores
    .venv/bin/python bench/store_bench.py --records 10000000    # the 10 M read figure (~47 GB)
    .venv/bin/python bench/store_bench.py --soak-s 1800         # with the 30-minute soak
    .venv/bin/python bench/store_bench.py --only soak --soak-s 1800   # the soak alone
    .venv/bin/python bench/store_bench.py --json .bench-output/store_bench.json

Records are real: `--pool` requests run through a tracer (`build_observability`, memory
store), each with the nine engine stages and their attributes, three prefill-chunk events,
the `Diagnoser`'s verdict (its baselines learn from the pool as it goes, so the causes vary),
a block chain of 1 KiB (128 engine block hashes, keyed on the tracer's worker as our engine's
are) and a client dict shaped as a joined probe beacon's. Copies of them, each with its own
request and trace id, are what every part writes.

1. Records written per CPU-second: `StoreWriter.submit` of `--write-records` records, then
   `flush`; CPU is this process's `time.process_time()` (every thread: the submitting loop,
   the writer's encoding and the driver). For PostgreSQL the server's CPU too: psutil's
   user + system time of the postmaster and its children, plus the children it reaped.
   SQLite and PostgreSQL rounds alternate (`--rounds` each, which goes first alternating).
2. Bytes per record on disk, from what part 1 wrote: SQLite's file and WAL after a
   `wal_checkpoint(TRUNCATE)` over the rows (and `size_bytes()`, the pages in use);
   PostgreSQL's `pg_total_relation_size('records')` (table, indexes, TOAST) over the rows.
3. "The slowest 50 of the last hour" at `--records` stored records (SQLite): the table is
   filled by direct `executemany` of synthetic rows into `records` (the writer's eight
   columns; every doc is ONE real encoded document, its request id, trace id, start, end and
   TTFT rewritten per row, its stage and event times left as they were), spread evenly over
   7 days, so the last hour holds 1/168 of them; TTFTs lognormal (median 150 ms). Then
   `build_observability` opens it (timed: migration check + the diagnosis' history read),
   and `--reps` interleaved reads of each: `SqlStore.window` alone (the SQL call, docs as
   text), `PersistentStore.window` (SQL + decoding 50 docs), and
   `GET /ui/api/requests?order=slowest&limit=50&from_unix_ms=..&to_unix_ms=..` through
   FastAPI (`include_routes`, Starlette's TestClient, in this process); plus the same GET
   on an empty window (the framework's own floor).
4. The serving thread's CPU per request (`time.thread_time_ns` around `Tracer.begin` ..
   `finish`, bench/tracer_cost.py's request of 1 token) with `--store memory`, an SQLite
   and a PostgreSQL store, interleaved rounds; and the whole process's CPU per request
   (serving thread, tracer worker, store writer, span encoding) through drain and flush.
5. `--soak-s N` (default off; the published figure is 30 minutes): `--soak-rate` records a
   second through a `StoreWriter` into SQLite with a small retention bound
   (`--soak-max-age-s`, `--soak-max-mib`, checked every `--soak-retention-interval-s`), RSS
   and the file (+ WAL) sampled every `--soak-interval-s`; first, last and max of each.

PostgreSQL is a throwaway cluster from tests/store/postgres_support.py (initdb as the
`postgres` user; fsync and synchronous_commit at their defaults); without it (no
postgresql-15, or `--no-postgres`) the PostgreSQL rows say skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                       # bench.lib, tracer
sys.path.insert(0, str(ROOT / "tests" / "store"))   # postgres_support

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

from bench.lib import machine  # noqa: E402
from bench.tracer_cost import MODEL, one_request, production_processor  # noqa: E402
from instrumented_engine.server.recording import TimelineRecorder  # noqa: E402
from tracer.core.export_fields import EngineBlocks  # noqa: E402
from tracer.record.clock import Clock  # noqa: E402
from tracer.sinks.logs import configure_logging  # noqa: E402
from tracer.store.codec import encode  # noqa: E402
from tracer.store.sql import SqlStore  # noqa: E402
from tracer.store.url import parse_store_url  # noqa: E402
from tracer.store.writer import Retention, StoreWriter  # noqa: E402
from tracer.web.observability import ObservabilitySettings, build_observability  # noqa: E402

MS = 1_000_000
S = 1_000_000_000
HOUR_NS = 3600 * S
FILL_DAYS = 7
BLOCKS = 128                   # 128 x 8-byte digests: a 1 KiB chain (2,048 prompt tokens)
FILL_BATCH = 50_000
# Retention while measuring reads: nothing trimmed under the bench (the default 2 GiB bound
# is below a 1 M-record file).
NO_TRIM = dict(retention_max_age_s=365 * 86400.0, retention_max_bytes=None)
# The store's "slowest" statement with its sort over the covering index alone (the rowids
# of the top 50), then their documents: shown beside the store's own for comparison.
ROWIDS_FIRST = ("SELECT doc FROM records WHERE rowid IN (SELECT rowid FROM records "
                "WHERE start_unix_ns >= ? AND start_unix_ns < ? AND ttft_ns IS NOT NULL "
                "ORDER BY ttft_ns DESC LIMIT ?) ORDER BY ttft_ns DESC")
PARTS = ("write", "read", "serving", "soak")
CAUSES = ("healthy",) * 17 + ("queue", "long_prefill", "cold_cache")


# -- realistic records ------------------------------------------------------------------

def realistic_request(tracer, recorder: TimelineRecorder, rid: str, rng: random.Random) -> None:
    """One engine request as our server traces it, with varied stage times."""
    num_prompt = BLOCKS * 16
    cached = rng.choice((0, 1024, 1536, 2032))
    queue = (int(rng.expovariate(1 / (3 * MS))) if rng.random() < 0.9
             else int(rng.uniform(50, 400) * MS))
    prefill = max(MS, int((num_prompt - cached) * rng.uniform(40_000, 80_000)))
    num_tokens = rng.randint(16, 256)
    gap = int(rng.uniform(15, 40) * MS)
    steps = [int(rng.uniform(0.1, 0.5) * MS), int(0.2 * MS), int(rng.uniform(0.4, 2) * MS),
             50_000, queue, prefill, MS, 100_000, 200_000]
    total = sum(steps) + num_tokens * gap + MS
    t = time.perf_counter_ns() - total          # it ends now
    active = tracer.begin(request_id=rid, model=MODEL, operation="chat", traceparent=None,
                          start_ns=t, attrs={"gen_ai.request.max_tokens": 512,
                                             "gen_ai.request.temperature": 0.7})
    c = t + steps[0]
    active.timeline.mark("receive", c)
    active.prompt_source = [{"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": f"Question {rid}: {'why ' * 20}?"}]
    recorder.attach(rid, active.timeline)
    c += steps[1]
    recorder.template_done(rid, c)
    c += steps[2]
    recorder.tokenize_done(rid, c, num_prompt)
    c += steps[3]
    recorder.kv_lookup_done(rid, c, cached, cached // 16, rng.randint(0, 4), rng.randint(1, 8))
    c += steps[4]
    recorder.scheduled(rid, c)
    chunk, chunk_tokens = prefill // 3, max(1, (num_prompt - cached) // 3)
    for _ in range(3):
        recorder.prefill_chunk(rid, c, c + chunk, chunk_tokens, 4, chunk_tokens + 3)
        c += chunk
    c += steps[6]
    recorder.first_token_sampled(rid, c)
    c += steps[7]
    recorder.first_text(rid, c, 1)
    c += steps[8]
    active.timeline.mark("send", c)
    for k in range(num_tokens):
        active.timeline.emit(c + k * gap)
    recorder.detach(rid)
    active.block_source = EngineBlocks([rng.getrandbits(63) for _ in range(BLOCKS)], None, 16)
    tracer.finish(active, end_ns=c + num_tokens * gap + MS, finish_reason="stop",
                  num_prompt_tokens=num_prompt, num_cached_tokens=cached,
                  num_output_tokens=num_tokens)


def client_dict(record, rng: random.Random) -> dict:
    """What a joined beacon leaves in `record.client` (tracer/web/probe/ingest.py,
    `client_view`), with plausible values."""
    server_ttft = (record.ttft_ns or 0) / MS
    headers = round(rng.uniform(5, 30), 1)
    first_token = round(headers + server_ttft + rng.uniform(1, 20), 1)
    end = round(first_token + rng.uniform(500, 5000), 1)
    span = f"{rng.getrandbits(64):016x}"
    chunk_ms = sorted(round(rng.uniform(first_token, end), 1) for _ in range(16))
    return {
        "trace_id": record.trace_id, "outcome": "ok",
        "t": {"start": 0.0, "headers": headers, "first_byte": headers + 0.4,
              "first_token": first_token, "first_paint": round(first_token + 4.2, 1),
              "end": end, "first_reasoning": None, "first_tool_call": None},
        "traceparent": f"00-{record.trace_id}-{span}-01", "status": 200,
        "url_path": "/v1/chat/completions", "chunks": 120,
        "itl_ms": {"count": 119, "mean": 24.1, "p50": 22.0, "p95": 41.3, "max": 88.0},
        "resource": {"dns": 0.0, "connect": 1.3, "tls": 4.1, "request": 0.2,
                     "response": round(end - headers, 1)},
        "probe_errors": 0, "sdk": "openai-node", "model": MODEL, "input_ms": 0.0,
        "chunk_ms": chunk_ms, "format": "openai-chat", "tool_calls": [],
        "client_ttft_ms": first_token, "network_overhead_ms": round(first_token - server_ttft, 3),
        "render_delay_ms": 4.2, "first_output_ms": first_token, "first_output_kind": "text",
        "first_tool_call_ms": None, "clock": {"offset_ms": 1.7, "rtt_ms": 3.4, "samples": 1},
        "stages": [{"stage": name, "start_ns": record.start_ns - (3 - k) * 2 * MS,
                    "end_ns": record.start_ns - (2 - k) * 2 * MS}
                   for k, name in enumerate(("client_queue", "network_up", "gateway"))],
        "buffering": None}


def make_pool(n: int, seed: int) -> list:
    rng = random.Random(seed)
    obs = build_observability(ObservabilitySettings(trace_store_capacity=n + 10),
                              model_names=(MODEL,), tracer_provider=TracerProvider())
    recorder = TimelineRecorder()
    for i in range(n):
        realistic_request(obs.tracer, recorder, f"pool-{i}", rng)
    assert obs.tracer.drain(120), "the tracer's worker did not drain"
    pool = obs.store.recent(n)
    assert obs.close(60)
    for record in pool:
        record.client = client_dict(record, rng)
    assert len(pool) == n and all(r.verdict is not None and len(r.block_chain) == 8 * BLOCKS
                                  and len(r.stages) == 9 and len(r.events) == 3 for r in pool)
    return pool


def copies(pool: list, n: int, tag: str, rng: random.Random) -> list:
    """`n` records of the pool's, each with its own request and trace id."""
    return [dataclasses.replace(pool[i % len(pool)], request_id=f"{tag}-{i}",
                                trace_id=f"{rng.getrandbits(128):032x}") for i in range(n)]


# -- helpers ----------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), linear between closest ranks."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def mib(n: float) -> float:
    return n / 2**20


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def checkpoint(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


class Postgres:
    """The throwaway cluster and the server's CPU, or why there is none."""

    def __init__(self, enabled: bool, why_not: str = "--no-postgres") -> None:
        self.server = None
        self.why = why_not if not enabled else ""
        if not enabled:
            return
        try:
            import pytest
            from postgres_support import PostgresServer
            server = PostgresServer(database="bench_write")
            try:
                server.__enter__()
            except (Exception, pytest.fail.Exception) as exc:
                self.why = str(exc).strip().splitlines()[0][:200]
                return
            self.server = server
        except ImportError as exc:
            self.why = f"cannot import the PostgreSQL harness: {exc}"

    def cpu_s(self) -> float:
        """User + system CPU seconds of the postmaster, its live children and the children it
        has reaped (backends and workers that exited)."""
        pid = int((self.server.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        main = psutil.Process(pid)
        t = main.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in main.children(recursive=True):
            try:
                ct = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += ct.user + ct.system
        return total

    def close(self) -> None:
        if self.server is not None:
            self.server.cleanup()
            self.server = None


# -- 1 and 2: writes and size -----------------------------------------------------------

def write_rounds(pool: list, args, work: Path, pg: Postgres, rng: random.Random) -> dict:
    backends = {"sqlite": sqlite_url(work / "write.sqlite3")}
    if pg.server is not None:
        backends["postgresql"] = pg.server.dsn
    writers = {}
    for name, url in backends.items():
        sql = SqlStore(parse_store_url(url))
        sql.open()
        writers[name] = StoreWriter(sql, Clock(), retention=Retention(max_bytes=None),
                                    max_pending=max(20_000, args.write_records))
    warm = copies(pool, min(500, args.write_records), "warm", rng)
    for name, writer in writers.items():   # connections, prepared paths, the first trim
        for i, record in enumerate(warm):
            writer.submit(dataclasses.replace(record, request_id=f"{name}-{record.request_id}"))
        assert writer.flush(120)
    results = {name: [] for name in writers}
    names = list(writers)
    print(f"1. records written per CPU-second (StoreWriter.submit + flush, "
          f"{args.write_records:,} records a round, {args.rounds} rounds each, interleaved)")
    print(f"  {'round':>5}  {'backend':<10}  {'records/CPU-s':>13}  {'CPU s':>6}  "
          f"{'server CPU s':>12}  {'incl. server':>12}  {'records/s wall':>14}")
    for round_no in range(args.rounds):
        for name in names if round_no % 2 == 0 else names[::-1]:
            writer = writers[name]
            batch = copies(pool, args.write_records, f"{name}-r{round_no}", rng)
            gc.collect()   # each round from the same state: no collection of the last one's
            server0 = pg.cpu_s() if name == "postgresql" else 0.0
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for record in batch:
                writer.submit(record)
            assert writer.flush(600), f"{name}: the writer did not flush in 600 s"
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            server = pg.cpu_s() - server0 if name == "postgresql" else None
            dropped = sum(writer.stats.dropped.values())
            assert dropped == 0 and writer.stats.failed_writes == 0, (name, writer.stats)
            row = {"records": len(batch), "cpu_s": cpu, "wall_s": wall, "server_cpu_s": server,
                   "per_cpu_s": len(batch) / cpu, "per_wall_s": len(batch) / wall,
                   "per_cpu_s_with_server": None if server is None
                   else len(batch) / (cpu + server)}
            results[name].append(row)
            print(f"  {round_no + 1:>5}  {name:<10}  {row['per_cpu_s']:>13,.0f}  {cpu:>6.2f}  "
                  + (f"{server:>12.2f}  {row['per_cpu_s_with_server']:>12,.0f}"
                     if server is not None else f"{'-':>12}  {'-':>12}")
                  + f"  {row['per_wall_s']:>14,.0f}")
    summary = {}
    for name in names:
        rows = results[name]
        med = statistics.median(r["per_cpu_s"] for r in rows)
        wall = statistics.median(r["per_wall_s"] for r in rows)
        summary[name] = {"rounds": rows, "median_per_cpu_s": med, "median_per_wall_s": wall}
        line = (f"  {name:<10}  median {med:>9,.0f} records per CPU-second (this process)")
        if name == "postgresql":
            both = statistics.median(r["per_cpu_s_with_server"] for r in rows)
            server_us = statistics.median(r["server_cpu_s"] / r["records"] * 1e6 for r in rows)
            summary[name]["median_per_cpu_s_with_server"] = both
            summary[name]["median_server_us_per_record"] = server_us
            line += (f"; {both:,.0f} counting the server's CPU too ({server_us:.0f} µs a "
                     f"record: postgres processes, psutil)")
        print(line + f"; wall {wall:,.0f} records/s")
    if "postgresql" not in writers:
        print(f"  postgresql  skipped ({pg.why})")
    if len(names) == 2:
        ratio = summary["sqlite"]["median_per_cpu_s"] / summary["postgresql"]["median_per_cpu_s"]
        summary["sqlite_over_postgresql"] = ratio
        print(f"  sqlite / postgresql (this process's CPU): {ratio:.2f}x")
    summary["sizes"] = sizes(writers, pg)
    for writer in writers.values():
        writer.close()
    return summary


def sizes(writers: dict, pg: Postgres) -> dict:
    print("2. bytes per record on disk (what part 1 wrote)")
    out = {}
    sql = writers["sqlite"].sql
    rows = sql.count()
    checkpoint(sql.url.path)
    file_b, used_b = sql.file_bytes(), sql.size_bytes()
    doc = sql._fetch("SELECT avg(length(doc)) FROM records", ())[0][0]
    out["sqlite"] = {"rows": rows, "file_bytes": file_b, "used_bytes": used_b,
                     "bytes_per_record": file_b / rows, "used_per_record": used_b / rows,
                     "doc_chars": doc}
    print(f"  sqlite      {file_b / rows:>7,.0f} B/record  (file + WAL after a checkpoint, "
          f"{mib(file_b):.1f} MiB / {rows:,} rows; pages in use {used_b / rows:,.0f} B/record; "
          f"doc {doc:,.0f} chars on average)")
    if "postgresql" in writers:
        sql = writers["postgresql"].sql
        rows = sql.count()
        total = sql.size_bytes()
        heap, doc = sql._fetch("SELECT pg_relation_size('records'), avg(length(doc)) "
                               "FROM records", ())[0]
        out["postgresql"] = {"rows": rows, "total_bytes": total, "heap_bytes": heap,
                             "bytes_per_record": total / rows, "doc_chars": float(doc)}
        print(f"  postgresql  {total / rows:>7,.0f} B/record  (pg_total_relation_size "
              f"{mib(total):.1f} MiB / {rows:,} rows: table {heap / rows:,.0f} + indexes and "
              f"TOAST {(total - heap) / rows:,.0f} B/record; TOAST compresses docs over ~2 kB)")
    else:
        print(f"  postgresql  skipped ({pg.why})")
    return out


# -- 3: reads at scale ------------------------------------------------------------------

def doc_template(record, clock: Clock) -> str:
    """One real encoded document as a %-template of its request id, trace id, start, end
    and TTFT."""
    doc = json.loads(encode(record, clock))
    doc.update(request_id="@@rid@@", trace_id="@@tid@@", start_unix_ns="@@start@@",
               end_unix_ns="@@end@@", ttft_ns="@@ttft@@")
    text = json.dumps(doc, separators=(",", ":")).replace("%", "%%")
    for key, spec in (("rid", "s"), ("tid", "s")):
        text = text.replace(f'"@@{key}@@"', f'"%({key}){spec}"')
    for key in ("start", "end", "ttft"):
        text = text.replace(f'"@@{key}@@"', f"%({key})d")
    return text


def fill(path: Path, n: int, template: str, now_ns: int, seed: int) -> dict:
    """`n` synthetic rows, start times evenly over FILL_DAYS days up to `now_ns`."""
    sql = SqlStore(parse_store_url(sqlite_url(path)))
    sql.open()          # the schema, as the store makes it
    sql.close()
    rng = random.Random(seed)
    span = FILL_DAYS * 24 * HOUR_NS
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = OFF")     # a bulk load, then back to WAL
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")
    insert = ("INSERT INTO records (request_id, trace_id, model, start_unix_ns, end_unix_ns, "
              "ttft_ns, cause, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    mu = math.log(150 * MS)

    def rows(lo: int, hi: int):
        for i in range(lo, hi):
            start = now_ns - span + (i * span) // n
            ttft = int(rng.lognormvariate(mu, 0.8))
            end = start + ttft + rng.randint(1, 8) * S
            rid, tid = f"fill-{i:010d}", f"{rng.getrandbits(128):032x}"
            yield (rid, tid, MODEL, start, end, ttft, CAUSES[i % len(CAUSES)],
                   template % {"rid": rid, "tid": tid, "start": start, "end": end, "ttft": ttft})

    started = time.perf_counter()
    for lo in range(0, n, FILL_BATCH):
        conn.execute("BEGIN")
        conn.executemany(insert, rows(lo, min(n, lo + FILL_BATCH)))
        conn.execute("COMMIT")
    seconds = time.perf_counter() - started
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    return {"seconds": seconds, "file_bytes": os.path.getsize(path)}


def read_at_scale(pool: list, args, work: Path) -> dict:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    path = work / "read.sqlite3"
    now_ns = time.time_ns()
    template = doc_template(pool[0], Clock())
    print(f"3. slowest 50 in the last hour at {args.records:,} stored records (SQLite)")
    filled = fill(path, args.records, template, now_ns, args.seed)
    lo, hi = now_ns - HOUR_NS, now_ns + MS
    print(f"  fill: {args.records:,} rows in {filled['seconds']:.1f} s "
          f"({args.records / filled['seconds']:,.0f} rows/s, executemany, journal off), "
          f"{mib(filled['file_bytes']):,.0f} MiB ({filled['file_bytes'] / args.records:,.0f} "
          f"B/row); every doc one real encoded document ({len(template):,} chars) with its "
          f"ids, start, end and TTFT rewritten per row, spread over {FILL_DAYS} days")
    started = time.perf_counter()
    obs = build_observability(ObservabilitySettings(store=sqlite_url(path), **NO_TRIM),
                              model_names=(MODEL,), tracer_provider=TracerProvider())
    open_s = time.perf_counter() - started
    sql = obs.store.sql
    in_window = sql._fetch("SELECT count(*) FROM records WHERE start_unix_ns >= ? AND "
                           "start_unix_ns < ?", (lo, hi))[0][0]
    plan = sql._fetch("EXPLAIN QUERY PLAN SELECT doc FROM records WHERE start_unix_ns >= ? "
                      "AND start_unix_ns < ? AND ttft_ns IS NOT NULL ORDER BY ttft_ns DESC "
                      "LIMIT ?", (lo, hi, 50))
    history_plan = sql._fetch("EXPLAIN QUERY PLAN SELECT doc FROM records WHERE start_unix_ns "
                              ">= ? AND start_unix_ns < ? AND model = ? ORDER BY end_unix_ns "
                              "DESC LIMIT ?", (0, 2**62, MODEL, 50))
    print(f"  open (build_observability: schema check, the diagnosis' history read): "
          f"{open_s:.2f} s (history plan: " + "; ".join(str(r[-1]) for r in history_plan)
          + ")")
    print(f"  {in_window:,} records in the last hour; plan: "
          + "; ".join(str(row[-1]) for row in plan))
    app = FastAPI()
    obs.include_routes(app)
    params = {"order": "slowest", "limit": "50", "from_unix_ms": str(lo // MS),
              "to_unix_ms": str(hi // MS)}
    empty = dict(params, from_unix_ms="946684800000", to_unix_ms="946688400000")  # 2000-01-01
    with TestClient(app) as client:
        def sql_call():
            docs = sql.window(lo, hi, limit=50, order="slowest")
            assert len(docs) == min(50, in_window)

        def sql_rowids_first():
            docs = [row[0] for row in sql._fetch(ROWIDS_FIRST, (lo, hi, 50))]
            assert len(docs) == min(50, in_window)

        def store_call():
            records = obs.store.window(lo, hi, limit=50, order="slowest")
            assert len(records) == min(50, in_window)

        def http_call():
            response = client.get("/ui/api/requests", params=params)
            rows = response.json()["requests"]
            assert response.status_code == 200 and len(rows) == min(50, in_window)

        def http_empty():
            response = client.get("/ui/api/requests", params=empty)
            assert response.status_code == 200 and response.json()["requests"] == []

        calls = {"sql": sql_call, "sql_rowids_first": sql_rowids_first, "window": store_call,
                 "http": http_call, "http_empty": http_empty}
        times: dict[str, list[float]] = {name: [] for name in calls}
        first = {}
        for name, call in calls.items():   # the first read of each (cold statement cache)
            started = time.perf_counter()
            call()
            first[name] = (time.perf_counter() - started) * 1e3
        for rep in range(args.reps):
            order = list(calls) if rep % 2 == 0 else list(calls)[::-1]
            for name in order:
                started = time.perf_counter()
                calls[name]()
                times[name].append((time.perf_counter() - started) * 1e3)
        slowest = client.get("/ui/api/requests", params=params).json()["requests"]
        # The live table's first request: no range, newest first (and the diagnosis' history
        # read at start-up is the same statement); a few only, it may take seconds.
        recent = []
        for _ in range(args.recent_reps):
            started = time.perf_counter()
            response = client.get("/ui/api/requests", params={"limit": "50"})
            recent.append((time.perf_counter() - started) * 1e3)
            assert response.status_code == 200 and len(response.json()["requests"]) == 50
    ttfts = [row.get("ttft_ms") for row in slowest]
    assert all(a >= b for a, b in zip(ttfts, ttfts[1:]) if a is not None and b is not None)
    obs.close(30)
    labels = {"sql": "SQL alone (SqlStore.window)",
              "sql_rowids_first": "SQL, top 50 from the index first (*)",
              "window": "PersistentStore.window (+ decode)",
              "http": "GET /ui/api/requests (FastAPI)",
              "http_empty": "the same GET, empty window"}
    out = {"records": args.records, "fill": filled, "open_s": open_s, "in_window": in_window,
           "reps": args.reps, "template_chars": len(template)}
    for name, label in labels.items():
        p50, p95 = statistics.median(times[name]), pct(times[name], 0.95)
        out[name] = {"p50_ms": p50, "p95_ms": p95, "max_ms": max(times[name]),
                     "first_ms": first[name]}
        print(f"  {label:<38} p50 {p50:8.2f} ms  p95 {p95:8.2f} ms  max {max(times[name]):8.2f}"
              f" ms  first {first[name]:8.2f} ms  (n={args.reps})")
    if recent:
        out["http_recent_no_range"] = {"ms": recent}
        print(f"  {'GET /ui/api/requests?limit=50 (recent)':<38} "
              + "  ".join(f"{v:,.1f} ms" for v in recent)
              + f"  (no range: the table's first view; n={len(recent)})")
    print("  (*) not the store's statement: the same answer with the sort over the (start, "
          "ttft) index's entries only, the 50 docs read after; SQLite's sorter otherwise "
          "carries every window row's doc")
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return out


# -- 4: the serving thread --------------------------------------------------------------

def serving_rounds(args, work: Path, pg: Postgres) -> dict:
    urls = {"memory": "memory", "sqlite": sqlite_url(work / "serving.sqlite3")}
    if pg.server is not None:
        urls["postgresql"] = pg.server.create_database("bench_serving")
    provider = TracerProvider()
    provider.add_span_processor(production_processor())
    devnull = open(os.devnull, "w")
    obs = {name: build_observability(ObservabilitySettings(store=url), model_names=(MODEL,),
                                     tracer_provider=provider,
                                     logger=configure_logging("json", stream=devnull))
           for name, url in urls.items()}
    recorder = TimelineRecorder()
    serving: dict[str, list[float]] = {name: [] for name in urls}
    process: dict[str, list[float]] = {name: [] for name in urls}
    next_id = iter(range(10**12))

    def batch(name: str, n: int) -> tuple[float, float]:
        o = obs[name]
        assert o.tracer.drain(60)
        if name != "memory":
            assert o.store.writer.flush(60)
        gc.collect()
        cpu0, thread0 = time.process_time(), time.thread_time_ns()
        for _ in range(n):
            one_request(o.tracer, recorder, next(next_id), 1)
        thread_ns = time.thread_time_ns() - thread0
        assert o.tracer.drain(120)
        if name != "memory":
            assert o.store.writer.flush(120)
        return thread_ns / n / 1e3, (time.process_time() - cpu0) / n * 1e6

    names = list(urls)
    for name in names:                 # warm-up: connections, caches, the diagnosis' window
        batch(name, min(200, args.requests))
    print(f"4. serving thread CPU per request (Tracer begin .. finish, 1 token, "
          f"bench/tracer_cost.py's request; {args.requests:,} requests a round, "
          f"{args.rounds} rounds, interleaved)")
    for round_no in range(args.rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            us, proc_us = batch(name, args.requests)
            serving[name].append(us)
            process[name].append(proc_us)
    out = {}
    base = statistics.median(serving["memory"])
    base_proc = statistics.median(process["memory"])
    for name in names:
        med, proc = statistics.median(serving[name]), statistics.median(process[name])
        out[name] = {"serving_us": serving[name], "process_us": process[name],
                     "median_serving_us": med, "median_process_us": proc,
                     "ratio_to_memory": med / base, "process_ratio_to_memory": proc / base_proc}
        rounds = " ".join(f"{v:.1f}" for v in serving[name])
        print(f"  {name:<10}  median {med:7.1f} µs  {med / base:5.2f}x memory  (rounds: {rounds});"
              f" whole process {proc:7.1f} µs/request ({proc / base_proc:.2f}x memory)")
    if pg.server is None:
        print(f"  postgresql  skipped ({pg.why})")
    for o in obs.values():
        assert o.close(60)
        assert o.tracer.num_sink_errors == 0
    for name in names:
        if name != "memory":
            stats = obs[name].store.writer.stats
            assert sum(stats.dropped.values()) == 0 and stats.failed_writes == 0, stats
    provider.shutdown()
    devnull.close()
    return out


# -- 5: soak ----------------------------------------------------------------------------

def soak(pool: list, args, work: Path) -> dict:
    path = work / "soak.sqlite3"
    sql = SqlStore(parse_store_url(sqlite_url(path)))
    sql.open()
    clock = Clock()
    retention = Retention(max_age_s=args.soak_max_age_s, max_bytes=int(args.soak_max_mib * 2**20))
    writer = StoreWriter(sql, clock, retention=retention,
                         retention_interval_s=args.soak_retention_interval_s)
    writer.start()
    interval = args.soak_interval_s or max(0.5, min(5.0, args.soak_s / 6))
    rng = random.Random(args.seed + 5)
    me = psutil.Process()
    print(f"5. soak: {args.soak_rate:g} records/s into SQLite for {args.soak_s:g} s; retention "
          f"max_age {args.soak_max_age_s:g} s, max_bytes {args.soak_max_mib:g} MiB, checked "
          f"every {args.soak_retention_interval_s:g} s; sampled every {interval:g} s")
    print(f"  {'t_s':>7}  {'rss_mib':>8}  {'file_mib':>8}  {'used_mib':>8}  {'rows':>7}  "
          f"{'written':>8}  {'trimmed':>8}  {'dropped':>7}")
    samples = []
    reader = SqlStore(parse_store_url(sqlite_url(path)))   # the sampler's own connection

    def sample(t: float) -> None:
        row = {"t_s": t, "rss_mib": mib(me.memory_info().rss),
               "file_mib": mib(sql.file_bytes() or 0), "used_mib": mib(reader.size_bytes()),
               "rows": reader.count(), "written": writer.stats.written,
               "trimmed": writer.stats.trimmed, "dropped": sum(writer.stats.dropped.values())}
        samples.append(row)
        print(f"  {t:>7.1f}  {row['rss_mib']:>8.1f}  {row['file_mib']:>8.2f}  "
              f"{row['used_mib']:>8.2f}  {row['rows']:>7,}  {row['written']:>8,}  "
              f"{row['trimmed']:>8,}  {row['dropped']:>7,}", flush=True)

    started = time.monotonic()
    submitted, next_sample = 0, 0.0
    wake = threading.Event()
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= next_sample:
            sample(elapsed)
            next_sample += interval
        if elapsed >= args.soak_s:
            break
        due = int(elapsed * args.soak_rate)
        while submitted < due:
            base = pool[submitted % len(pool)]
            now = time.perf_counter_ns()
            writer.submit(dataclasses.replace(
                base, request_id=f"soak-{submitted}", trace_id=f"{rng.getrandbits(128):032x}",
                start_ns=now - base.e2e_ns, end_ns=now))
            submitted += 1
        wake.wait(0.01)   # the submit clock's tick
    assert writer.close(60)
    reader.close()
    out = {"seconds": args.soak_s, "rate": args.soak_rate, "submitted": submitted,
           "samples": samples}
    for key in ("rss_mib", "file_mib", "rows"):
        values = [s[key] for s in samples]
        out[key] = {"first": values[0], "last": values[-1], "max": max(values)}
    d = out
    print(f"  soak RSS MiB: first {d['rss_mib']['first']:.1f} last {d['rss_mib']['last']:.1f} "
          f"max {d['rss_mib']['max']:.1f}; file MiB: first {d['file_mib']['first']:.2f} last "
          f"{d['file_mib']['last']:.2f} max {d['file_mib']['max']:.2f}; rows: first "
          f"{d['rows']['first']:,} last {d['rows']['last']:,} max {d['rows']['max']:,}; "
          f"{submitted:,} submitted, {writer.stats.written:,} written, "
          f"{writer.stats.trimmed:,} trimmed, {sum(writer.stats.dropped.values()):,} dropped")
    return out


# -- main -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="stored records for the read figure (10000000 for the 10 M one: "
                             "~4.7 kB each on disk)")
    parser.add_argument("--reps", type=int, default=200, help="reads of each kind (part 3)")
    parser.add_argument("--recent-reps", type=int, default=3,
                        help="GETs of the unranged recent 50 (part 3; seconds each at 1 M)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per backend (parts 1, 4)")
    parser.add_argument("--write-records", type=int, default=5_000,
                        help="records a write round (part 1)")
    parser.add_argument("--requests", type=int, default=2_000,
                        help="requests a serving round (part 4)")
    parser.add_argument("--pool", type=int, default=400,
                        help="distinct real records the copies are made of")
    parser.add_argument("--soak-s", type=float, default=0.0,
                        help="soak seconds (0: no soak; the published figure is 1800)")
    parser.add_argument("--soak-rate", type=float, default=200.0, help="records per second")
    parser.add_argument("--soak-max-age-s", type=float, default=120.0)
    parser.add_argument("--soak-max-mib", type=float, default=16.0)
    parser.add_argument("--soak-retention-interval-s", type=float, default=2.0)
    parser.add_argument("--soak-interval-s", type=float, default=None,
                        help="seconds between samples (default: 5, less for a short soak)")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS),
                        help="these parts only (write includes the sizes; soak needs --soak-s)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the SQLite files go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the SQLite files")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write every figure here as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.reps < 1 or args.records < 1:
        parser.error("--rounds, --reps and --records must be at least 1")

    info = machine.describe(None)
    print(f"machine: {info['cpu_model']}, {info['logical_cpus']} logical CPUs, Python "
          f"{info['python_version']}, SQLite {sqlite3.sqlite_version}, {info['date_utc']}, "
          f"commit {info['git_commit']}" + (" (uncommitted changes)" if info["git_dirty"] else ""))
    work = Path(tempfile.mkdtemp(prefix="store-bench-", dir=args.dir))
    rng = random.Random(args.seed)
    started = time.perf_counter()
    pool = make_pool(args.pool, args.seed)
    sizes_ = [len(encode(r, Clock())) for r in pool]
    causes = sorted({r.verdict.cause for r in pool})
    print(f"records: {len(pool)} real ones from a tracer in {time.perf_counter() - started:.1f}"
          f" s (9 stages, 3 events, a verdict: {', '.join(causes)}; a {8 * BLOCKS:,}-byte "
          f"block chain; a client dict); encoded doc median {statistics.median(sizes_):,.0f} "
          f"chars")
    needed = bool({"write", "serving"} & set(args.only))
    pg = Postgres(needed and not args.no_postgres,
                  "--no-postgres" if args.no_postgres else "not needed by --only")
    summary: dict = {"machine": info, "argv": sys.argv[1:] if argv is None else argv,
                     "postgresql": pg.why or "ok"}
    try:
        if "write" in args.only:
            summary["write"] = write_rounds(pool, args, work, pg, rng)
        if "read" in args.only:
            summary["read"] = read_at_scale(pool, args, work)
        if "serving" in args.only:
            summary["serving"] = serving_rounds(args, work, pg)
        pg.close()
        if args.soak_s > 0 and "soak" in args.only:
            summary["soak"] = soak(pool, args, work)
    finally:
        pg.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"files kept in {work}")
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
