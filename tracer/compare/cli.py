"""`python -m tracer compare A.json B.json`: what moved between two replays of one trace;
`python -m tracer compare --url URL --before WINDOW --after WINDOW`: between two stored
windows of live traffic (before and after a deploy).

Reads two `tracer bench --replay --out` results (docs/reference.md, "Compare"). For TTFT and
TPOT (the client's) and for each server stage both files carry, the change B − A at p50, p95
and p99 with a percentile-bootstrap interval, requests paired by trace line
(tracer/compare/bootstrap.py); then the mix of the
verdicts' causes before and after. `--fail-if-worse NAME[@pQ]:PCT` makes it a CI gate.

Two stored windows hold different requests: they are compared unpaired (each window
resampled on its own), TTFT being the server's, from the store behind `URL`'s
`/ui/api/requests` (the newest `--max-requests` of each window).

Exit status: 0, 1 when a gate's interval lies wholly above A's value × (1 + PCT/100) (worse
beyond the margin with the chosen confidence), 2 on unreadable or incompatible input.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter

from tracer.compare.bootstrap import Change, bootstrap_change, quantile_statistic
from tracer.record.stages import ALL_STAGE_LABELS, PROXY_STAGE_LABELS
from tracer.record.when import parse_when

RESULT_KIND = "ttftscope.replay"   # tracer/bench/replay.py writes it
QUANTILES = (50, 95, 99)
CLIENT_METRICS = ("ttft", "tpot")
_GATE = re.compile(r"^(?P<name>[a-z_]+)(?:@p(?P<q>50|95|99))?:(?P<pct>\d+(?:\.\d+)?)$")
_STAGE_ORDER = {s: i for i, s in enumerate(dict.fromkeys(ALL_STAGE_LABELS + PROXY_STAGE_LABELS))}


class InputError(ValueError):
    """Input compare cannot use: exit status 2."""


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("a", metavar="A.json", nargs="?", help="the replay before the change")
    add("b", metavar="B.json", nargs="?", help="the replay after it")
    add("--url", default=None, metavar="BASE_URL",
        help="a live engine, proxy or collector whose store holds both windows")
    add("--before", default=None, metavar="SINCE..UNTIL",
        help="with --url: the window before the change; each end an ISO date and time, "
             "unix ms or a time ago (15m, 2h, 7d)")
    add("--after", default=None, metavar="SINCE..UNTIL",
        help="with --url: the window after it (default: from --before's end to now)")
    add("--max-requests", type=int, default=10_000,
        help="with --url: the newest requests taken from each window (default 10000)")
    add("--api-key", default=None, help="Bearer token of a live server")
    add("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    add("--confidence", type=float, default=0.95, help="interval coverage (default 0.95)")
    add("--seed", type=int, default=0, help="bootstrap seed")
    add("--fail-if-worse", action="append", default=[], metavar="NAME[@pQ]:PCT",
        help="exit 1 when NAME (ttft, tpot or a stage) got worse by more than PCT %% at "
             "p50/p95/p99 (all three unless @pQ), by the interval's lower end; repeatable")
    add("--json", action="store_true", help="print the comparison as JSON")


def load_result(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND \
            or not isinstance(doc.get("requests"), list):
        raise InputError(f"{path}: not a `tracer bench --replay` result (kind {RESULT_KIND})")
    return doc


def samples(doc: dict) -> dict[str, dict[object, float]]:
    """Per metric, each completed request's value in ms by its trace line (its identity in
    both replays): ttft, tpot, and each server stage."""
    out: dict[str, dict[object, float]] = {m: {} for m in CLIENT_METRICS}
    for position, row in enumerate(doc["requests"]):
        if not row.get("ok"):
            continue
        key = row.get("line", position)
        for metric in CLIENT_METRICS:
            if row.get(f"{metric}_ms") is not None:
                out[metric][key] = float(row[f"{metric}_ms"])
        for stage, ms in ((row.get("server") or {}).get("stages_ms") or {}).items():
            out.setdefault(stage, {})[key] = float(ms)
    return {name: values for name, values in out.items() if values}


def _paired(a: dict[object, float], b: dict[object, float]) -> tuple[list, list] | None:
    """The values of the requests both completed, in one order; None when fewer than 2."""
    keys = [k for k in a if k in b]
    return ([a[k] for k in keys], [b[k] for k in keys]) if len(keys) >= 2 else None


def _causes(doc: dict) -> Counter:
    return Counter(row.get("cause") for row in doc["requests"]
                   if row.get("ok") and row.get("cause"))


def compare(a: dict, b: dict, *, resamples: int, confidence: float, seed: int,
            paired: bool = True) -> dict:
    if paired and a["metadata"].get("trace_sha256") != b["metadata"].get("trace_sha256"):
        raise InputError("A and B replayed different traces (trace_sha256 differs)")
    sa, sb = samples(a), samples(b)
    names = [m for m in CLIENT_METRICS if m in sa and m in sb]
    names += sorted((set(sa) & set(sb)) - set(CLIENT_METRICS),
                    key=lambda s: (_STAGE_ORDER.get(s, len(_STAGE_ORDER)), s))
    if not names:
        raise InputError("A and B share no metric with completed requests")
    statistics = {f"p{q}": quantile_statistic(q) for q in QUANTILES}
    metrics, counts = {}, {}
    for name in names:
        # Two replays of one trace: request i of A and of B are the same request, so the
        # bootstrap draws them together (tracer/compare/bootstrap.py); only requests that
        # completed in both count.
        if paired:
            pair = _paired(sa[name], sb[name])
        else:   # two windows: different requests, each resampled on its own
            pair = (list(sa[name].values()), list(sb[name].values()))
            pair = pair if min(map(len, pair)) >= 2 else None
        if pair is None:
            continue
        counts[name] = len(pair[0]) if paired else (len(pair[0]), len(pair[1]))
        metrics[name] = bootstrap_change(*pair, statistics, resamples=resamples,
                                         confidence=confidence, seed=seed, paired=paired)
    if not metrics:
        raise InputError("A and B share no metric with two requests completed in both")
    ca, cb = _causes(a), _causes(b)
    return {"metrics": metrics, "num_paired": counts,
            "causes": {c: (ca[c], cb[c]) for c in sorted(set(ca) | set(cb))},
            "resamples": resamples, "confidence": confidence, "seed": seed}


def window_arguments(before: str | None, after: str | None,
                     now_unix_ms: int | None = None) -> tuple[tuple[int, int], tuple[int, int]]:
    """(before, after) windows in unix ms from `SINCE..UNTIL` arguments; `after` defaults to
    the end of `before` until now.

    >>> window_arguments("1000..2000", None, now_unix_ms=5000)
    ((1000, 2000), (2000, 5000))
    """
    now_unix_ms = int(time.time() * 1000) if now_unix_ms is None else now_unix_ms
    if before is None:
        raise InputError("--url needs --before SINCE..UNTIL (and --after, or now)")

    def window(text: str, name: str) -> tuple[int, int]:
        since, sep, until = text.partition("..")
        if not sep:
            raise InputError(f"--{name} {text!r}: expected SINCE..UNTIL")
        try:
            lo = parse_when(since, now_unix_ms)
            hi = parse_when(until, now_unix_ms) if until else now_unix_ms
        except ValueError as exc:
            raise InputError(f"--{name}: {exc}") from None
        if hi <= lo:
            raise InputError(f"--{name}: its end must be after its start")
        return lo, hi

    first = window(before, "before")
    second = window(after, "after") if after is not None else (first[1], now_unix_ms)
    if second[1] <= second[0]:
        raise InputError("--after: its end must be after its start")
    return first, second


def fetch_window(base_url: str, window: tuple[int, int], limit: int,
                 api_key: str | None) -> dict:
    """One stored window as a result `compare` reads: the server's TTFT, TPOT, stages and
    cause of each request."""
    import httpx   # only the live mode needs it

    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    url = f"{base_url.rstrip('/')}/ui/api/requests"
    params = {"from_unix_ms": window[0], "to_unix_ms": window[1], "limit": limit,
              "stages": 1}
    try:
        response = httpx.get(url, params=params, headers=headers, timeout=60.0)
    except httpx.HTTPError as exc:
        raise InputError(f"{base_url}: {exc}") from None
    if response.status_code != 200:
        raise InputError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
    rows = response.json().get("requests")
    if not isinstance(rows, list):
        raise InputError(f"{url}: no 'requests' list")
    return {"kind": RESULT_KIND, "metadata": {"window_unix_ms": list(window)},
            "requests": [{"ok": row.get("server_ttft_ms") is not None,
                          "line": row.get("request_id"), "ttft_ms": row.get("server_ttft_ms"),
                          "tpot_ms": row.get("tpot_ms"), "cause": row.get("cause"),
                          "server": {"stages_ms": row.get("stages_ms") or {}}}
                         for row in rows if isinstance(row, dict)]}


def parse_gate(spec: str) -> tuple[str, tuple[int, ...], float]:
    match = _GATE.match(spec)
    if not match:
        raise InputError(f"--fail-if-worse {spec!r}: expected NAME[@pQ]:PCT, e.g. ttft@p95:5")
    q = match["q"]
    return match["name"], (int(q),) if q else QUANTILES, float(match["pct"])


def failed_gates(result: dict, gates: list[str]) -> list[str]:
    """A sentence for each gate whose interval lies wholly beyond its margin."""
    failures = []
    for spec in gates:
        name, quantiles, pct = parse_gate(spec)
        if name not in result["metrics"]:
            raise InputError(f"--fail-if-worse {spec!r}: no {name!r} in both results "
                             f"(have: {', '.join(result['metrics'])})")
        for q in quantiles:
            change: Change = result["metrics"][name][f"p{q}"]
            if change.low > change.a * pct / 100:
                failures.append(f"{name} p{q} worse by {change.delta:+.2f} ms "
                                f"[{change.low:+.2f}, {change.high:+.2f}], over {pct:g} % of "
                                f"{change.a:.2f} ms")
    return failures


def format_text(result: dict) -> str:
    level = f"{100 * result['confidence']:g} %"
    lines = [f"{'metric':<22}{'q':>4}{'A ms':>10}{'B ms':>10}{'B-A ms':>10}  "
             f"{level + ' interval':<22}{'change':>8}"]
    for name, changes in result["metrics"].items():
        for label, c in changes.items():
            pct = "n/a" if c.percent is None else f"{c.percent:+.1f}%"
            mark = " *" if c.excludes_zero() else ""
            lines.append(f"{name:<22}{label:>4}{c.a:>10.2f}{c.b:>10.2f}{c.delta:>+10.2f}  "
                         f"{f'[{c.low:+.2f}, {c.high:+.2f}]':<22}{pct:>8}{mark}")
    how = "paired by trace line" if result.get("paired", True) else "two windows, unpaired"
    lines.append(f"* the interval excludes 0 ({how}, {result['resamples']} "
                 f"resamples, seed {result['seed']})")
    if result["causes"]:
        total_a = sum(a for a, _ in result["causes"].values()) or 1
        total_b = sum(b for _, b in result["causes"].values()) or 1
        lines.append(f"{'cause':<22}{'A':>12}{'B':>12}")
        for cause, (na, nb) in result["causes"].items():
            lines.append(f"{cause:<22}{f'{na} ({100 * na / total_a:.0f}%)':>12}"
                         f"{f'{nb} ({100 * nb / total_b:.0f}%)':>12}")
    else:
        lines.append("causes: none in either result (no server record joined)")
    return "\n".join(lines)


def as_json(result: dict) -> dict:
    return {**result, "metrics": {
        name: {label: {"a": c.a, "b": c.b, "delta": c.delta, "low": c.low, "high": c.high,
                       "percent": c.percent, "excludes_zero": c.excludes_zero()}
               for label, c in changes.items()}
        for name, changes in result["metrics"].items()},
        "causes": {c: {"a": na, "b": nb} for c, (na, nb) in result["causes"].items()}}


def run_compare_command(args: argparse.Namespace) -> int:
    try:
        for spec in args.fail_if_worse:
            parse_gate(spec)    # a bad gate is refused before any work
        if args.url is not None:
            if args.a is not None or args.b is not None:
                raise InputError("A.json B.json or --url with --before/--after, not both")
            before, after = window_arguments(args.before, args.after)
            a, b = (fetch_window(args.url, w, args.max_requests, args.api_key)
                    for w in (before, after))
            result = compare(a, b, resamples=args.resamples, confidence=args.confidence,
                             seed=args.seed, paired=False)
            result["paired"] = False
        else:
            if args.a is None or args.b is None:
                raise InputError("give two replay results (A.json B.json), or --url with "
                                 "--before")
            result = compare(load_result(args.a), load_result(args.b),
                             resamples=args.resamples, confidence=args.confidence,
                             seed=args.seed)
        failures = failed_gates(result, args.fail_if_worse)
    except (InputError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(result), indent=2) if args.json else format_text(result))
    for failure in failures:
        print(f"compare: FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0
