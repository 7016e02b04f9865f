"""`python -m tracer diagnose`: a window's TTFT causes, ranked, with the change each needs.

    python -m tracer diagnose --log requests.jsonl --minutes 60
    python -m tracer diagnose --url http://127.0.0.1:8000 --minutes 15 --fail-above-s 30
    python -m tracer diagnose --url http://127.0.0.1:8000 --since 2026-12-05T14:00 \\
        --until 2026-12-05T14:15

Reads the `request_finished` lines a front logs (JSON, one per line; tracer/sinks/logs.py),
or a live server's `/ui/api/diagnosis`, and ranks them with the same function the UI uses
(`tracer.record.diagnosis_window.rank_causes`). With `--fail-above-s` it exits 1 when the
top cause costs more than that many TTFT seconds (above the SLO by default), so a CI job or
a canary can gate on it (docs/architecture.md, "Diagnosis").
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timedelta
from typing import TextIO

from tracer.record.causes import NO_CAUSE
from tracer.record.diagnosis_window import DEFAULT_TTFT_SLO_S, rank_causes, row_of_log
from tracer.record.when import parse_when

EXIT_OK, EXIT_GATE, EXIT_INPUT = 0, 1, 2
METRICS = ("above_slo_s", "above_p95_s", "excess_s")
_TIMEOUT_S = 30.0


def add_diagnose_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--log", metavar="FILE",
                        help="a JSON-lines log with request_finished lines ('-': stdin)")
    source.add_argument("--url", metavar="BASE_URL",
                        help="a live engine, proxy or collector (its /ui/api/diagnosis)")
    parser.add_argument("--minutes", type=int, default=None,
                        help="the window: the last N minutes (a log: before its newest line; "
                             "default all of it; a live server: default 15)")
    parser.add_argument("--since", default=None, metavar="WHEN",
                        help="the window's start: an ISO date and time (local unless it has "
                             "an offset), unix ms, or a time ago (15m, 2h, 7d)")
    parser.add_argument("--until", default=None, metavar="WHEN",
                        help="the window's end (default now; the same forms as --since)")
    parser.add_argument("--slo-ms", type=float, default=DEFAULT_TTFT_SLO_S * 1e3,
                        help=f"the TTFT objective (default {DEFAULT_TTFT_SLO_S * 1e3:g} ms)")
    parser.add_argument("--fail-above-s", type=float, default=None, metavar="SECONDS",
                        help="exit 1 when the top cause costs more than this (see --metric)")
    parser.add_argument("--metric", choices=METRICS, default="above_slo_s",
                        help="what --fail-above-s compares (default above_slo_s)")
    parser.add_argument("--api-key", default=None, help="Bearer token of a live server")
    parser.add_argument("--json", action="store_true", help="print the ranking as JSON")


def run_diagnose_command(args: argparse.Namespace, out: TextIO = sys.stdout,
                         err: TextIO = sys.stderr) -> int:
    try:
        window = _window(args)
        if args.log is not None:
            ranking = _from_log(args.log, args.minutes, args.slo_ms, window)
        else:
            ranking = _from_server(args.url, args.minutes or 15, args.slo_ms, args.api_key,
                                   window)
    except (OSError, ValueError) as exc:
        print(f"tracer diagnose: {exc}", file=err)
        return EXIT_INPUT
    out.write(json.dumps(ranking, indent=2) + "\n" if args.json else format_table(ranking))
    return gate(ranking, args.fail_above_s, args.metric, err)


def gate(ranking: dict, limit_s: float | None, metric: str, err: TextIO) -> int:
    """EXIT_GATE when the top cause's `metric` is over `limit_s` (healthy and unjudged name
    no cause, so never count)."""
    if limit_s is None:
        return EXIT_OK
    causes = [c for c in ranking["causes"] if c["cause"] not in NO_CAUSE]
    worst = max(causes, key=lambda c: c[metric], default=None)
    if worst is not None and worst[metric] > limit_s:
        print(f"tracer diagnose: {worst['cause']} cost {worst[metric]:g} s ({metric}), over "
              f"the {limit_s:g} s limit", file=err)
        return EXIT_GATE
    return EXIT_OK


def format_table(ranking: dict) -> str:
    """The ranking as a plain table, costliest cause first, each with its action.

    >>> print(format_table({"num_requests": 1, "slo_ms": 2000.0, "p95_ms": 3000.0, "causes": [
    ...     {"cause": "queueing", "num_requests": 1, "above_slo_s": 1.0, "above_p95_s": 0.0,
    ...      "excess_s": 2.9, "action": "vLLM: raise --max-num-seqs",
    ...      "slowest": [{"trace_id": "ab" * 16, "ttft_ms": 3000.0}]}]}), end="")
    1 requests, TTFT p95 3000 ms, SLO 2000 ms
    cause        requests  above SLO s  above p95 s  excess s  slowest
    queueing            1        1.000        0.000     2.900  abababababababababababababababab (3000 ms)
      -> vLLM: raise --max-num-seqs
    """
    p95 = ranking.get("p95_ms")
    lines = [f"{ranking['num_requests']} requests, TTFT p95 "
             f"{'-' if p95 is None else f'{p95:g}'} ms, SLO {ranking['slo_ms']:g} ms",
             f"{'cause':<12} {'requests':>8}  {'above SLO s':>11}  {'above p95 s':>11}  "
             f"{'excess s':>8}  slowest"]
    for c in ranking["causes"]:
        slowest = ", ".join(f"{s['trace_id']} ({s['ttft_ms']:g} ms)" for s in c["slowest"][:1])
        lines.append(f"{c['cause']:<12} {c['num_requests']:>8}  {c['above_slo_s']:>11.3f}  "
                     f"{c['above_p95_s']:>11.3f}  {c['excess_s']:>8.3f}  {slowest}")
        if c["cause"] not in NO_CAUSE:
            lines.append(f"  -> {c['action']}")
    return "\n".join(lines) + "\n"


def _window(args: argparse.Namespace) -> tuple[int | None, int | None] | None:
    """(from, to) in unix ms from --since / --until; None when neither is given."""
    if args.since is None and args.until is None:
        return None
    if args.minutes is not None:
        raise ValueError("--minutes or --since/--until, not both")
    now_ms = int(time.time() * 1000)
    lo = None if args.since is None else parse_when(args.since, now_ms)
    hi = None if args.until is None else parse_when(args.until, now_ms)
    if lo is not None and hi is not None and hi <= lo:
        raise ValueError("--until must be after --since")
    return lo, hi


def _from_log(path: str, minutes: int | None, slo_ms: float,
              window: tuple[int | None, int | None] | None = None) -> dict:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8", errors="replace")
    rows, stamps = [], []
    with stream:
        for line in stream:
            line = line.strip()
            if not line.startswith("{"):
                continue       # a console-format or foreign line: not ours to judge
            try:
                fields = json.loads(line)
            except ValueError:
                continue
            row = row_of_log(fields) if isinstance(fields, dict) else None
            if row is not None:
                rows.append(row)
                stamps.append(_timestamp(fields.get("timestamp")))
    if minutes is not None:
        known = [t for t in stamps if t is not None]
        if known:
            since = max(known) - timedelta(minutes=minutes)
            rows = [r for r, t in zip(rows, stamps) if t is None or t >= since]
    if window is not None:   # a line without a time cannot be placed in it
        lo, hi = window
        rows = [r for r, t in zip(rows, stamps) if t is not None
                and (lo is None or t.timestamp() * 1000 >= lo)
                and (hi is None or t.timestamp() * 1000 < hi)]
    return rank_causes(rows, slo_ms=slo_ms)


def _timestamp(value) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _from_server(base_url: str, minutes: int, slo_ms: float, api_key: str | None,
                 window: tuple[int | None, int | None] | None = None) -> dict:
    import httpx   # only the live mode needs it

    params = {"minutes": minutes, "slo_ms": round(slo_ms)}
    if window is not None:
        params.update({k: v for k, v in zip(("from_unix_ms", "to_unix_ms"), window)
                       if v is not None})
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/ui/api/diagnosis",
                             params=params,
                             headers=headers, timeout=_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise OSError(f"{base_url}: {exc}") from exc
    if response.status_code != 200:
        raise ValueError(f"{base_url} answered {response.status_code}: {response.text[:300]}")
    return response.json()
