"""bench/store_bench.py at tiny sizes: every figure is printed with a sane value (writes per
CPU-second for both backends, bytes per record, the slowest-50 read, the serving thread
against memory, the soak's samples), the --json file holds them, and run_all parses them."""
from __future__ import annotations

import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_store_bench_prints_every_figure(tmp_path):
    summary_path = tmp_path / "store.json"
    out = run_bench_script("store_bench.py", "--records", "2000", "--rounds", "1",
                           "--write-records", "300", "--requests", "200", "--pool", "60",
                           "--reps", "10", "--recent-reps", "1", "--soak-s", "3",
                           "--soak-interval-s", "0.5", "--soak-max-mib", "0.5",
                           "--soak-retention-interval-s", "0.5", "--dir", str(tmp_path),
                           "--json", str(summary_path), timeout_s=300)
    assert out.startswith("machine: "), out
    # 1. writes, both backends, this process's CPU (and the server's for PostgreSQL)
    writes = dict(re.findall(r"^  (sqlite|postgresql)\s+median\s+([\d,]+) records per "
                             r"CPU-second", out, re.MULTILINE))
    assert set(writes) == {"sqlite", "postgresql"}, out
    assert all(_number(v) > 0 for v in writes.values()), out
    assert re.search(r"counting the server's CPU too \(\d+ µs a record", out), out
    rounds = re.findall(r"^\s+1\s+(sqlite|postgresql)\s+([\d,]+)", out, re.MULTILINE)
    assert sorted(name for name, _ in rounds) == ["postgresql", "sqlite"], out
    # 2. bytes per record
    sizes = dict(re.findall(r"^  (sqlite|postgresql)\s+([\d,]+) B/record", out, re.MULTILINE))
    assert set(sizes) == {"sqlite", "postgresql"}, out
    assert all(100 <= _number(v) <= 100_000 for v in sizes.values()), out
    # 3. the slowest 50 at N records: the SQL alone and through FastAPI
    assert "3. slowest 50 in the last hour at 2,000 stored records (SQLite)" in out
    reads = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(
        r"^  (SQL alone|PersistentStore.window|GET /ui/api/requests) \(\S+.*?\)\s+p50\s+"
        r"([\d.]+) ms\s+p95\s+([\d.]+) ms", out, re.MULTILINE)}
    assert set(reads) == {"SQL alone", "PersistentStore.window", "GET /ui/api/requests"}, out
    assert all(0 < p50 <= p95 for p50, p95 in reads.values()), reads
    # 4. the serving thread, each store against memory
    serving = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(
        r"^  (memory|sqlite|postgresql)\s+median\s+([\d.]+) µs\s+([\d.]+)x memory", out,
        re.MULTILINE)}
    assert set(serving) == {"memory", "sqlite", "postgresql"}, out
    assert serving["memory"][1] == 1.0 and all(us > 0 for us, _ in serving.values()), serving
    # 5. the soak: samples, then first/last/max; the tiny size bound made the writer trim
    samples = re.findall(r"^\s+(\d+\.\d)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d,]+\s+[\d,]+",
                         out[out.index("5. soak"):], re.MULTILINE)
    assert len(samples) >= 4 and all(float(rss) > 0 for _, rss, _ in samples), out
    soak = re.search(r"^  soak RSS MiB: first ([\d.]+) last ([\d.]+) max ([\d.]+); file MiB: "
                     r"first ([\d.]+) last ([\d.]+) max ([\d.]+).*?([\d,]+) trimmed, 0 dropped",
                     out, re.MULTILINE)
    assert soak and float(soak[3]) >= float(soak[2]) > 0 and _number(soak[7]) > 0, out

    summary = json.loads(summary_path.read_text())
    assert summary["postgresql"] == "ok"
    assert summary["write"]["sizes"]["sqlite"]["rows"] > 0
    assert summary["read"]["in_window"] > 0 and summary["read"]["http"]["p95_ms"] > 0
    assert summary["serving"]["sqlite"]["ratio_to_memory"] > 0
    assert len(summary["soak"]["samples"]) == len(samples)

    figures = [figure for figure, _, _ in run_all.parse_store_bench(out)]
    assert figures == [
        "store: sqlite records written per CPU-second",
        "store: postgresql records written per CPU-second",
        "store: sqlite bytes per record on disk", "store: postgresql bytes per record on disk",
        "store: slowest 50 of the last hour, SQL alone, 2,000 records",
        "store: slowest 50 of the last hour, GET /ui/api/requests, 2,000 records",
        "store: GET /ui/api/requests?limit=50 (no range), 2,000 records",
        "store: serving thread per request, memory", "store: serving thread per request, sqlite",
        "store: serving thread per request, postgresql",
        "store soak: RSS / file first, last, max"], out
    # Nothing left behind in --dir (the files go to a temporary folder inside it).
    assert [p.name for p in tmp_path.iterdir()] == ["store.json"]
