"""`python -m tracer compare A.json B.json`: what moved between two replays of one trace.

Reads two `tracer bench --replay --out` results (docs/reference.md, "Compare"). For TTFT and
TPOT (the client's) and for each server stage both files carry, the change B − A at p50, p95
and p99 with a percentile-bootstrap interval, requests paired by trace line
(tracer/compare/bootstrap.py); then the mix of the
verdicts' causes before and after. `--fail-if-worse NAME[@pQ]:PCT` makes it a CI gate.

Exit status: 0, 1 when a gate's interval lies wholly above A's value × (1 + PCT/100) (worse
beyond the margin with the chosen confidence), 2 on unreadable or incompatible input.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter

from tracer.compare.bootstrap import Change, bootstrap_change, quantile_statistic
from tracer.record.stages import ALL_STAGE_LABELS, PROXY_STAGE_LABELS

RESULT_KIND = "ttftscope.replay"   # tracer/bench/replay.py writes it
QUANTILES = (50, 95, 99)
CLIENT_METRICS = ("ttft", "tpot")
_GATE = re.compile(r"^(?P<name>[a-z_]+)(?:@p(?P<q>50|95|99))?:(?P<pct>\d+(?:\.\d+)?)$")
_STAGE_ORDER = {s: i for i, s in enumerate(dict.fromkeys(ALL_STAGE_LABELS + PROXY_STAGE_LABELS))}


class InputError(ValueError):
    """Input compare cannot use: exit status 2."""


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("a", metavar="A.json", help="the replay before the change")
    add("b", metavar="B.json", help="the replay after it")
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


def compare(a: dict, b: dict, *, resamples: int, confidence: float, seed: int) -> dict:
    if a["metadata"].get("trace_sha256") != b["metadata"].get("trace_sha256"):
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
        pair = _paired(sa[name], sb[name])
        if pair is None:
            continue
        counts[name] = len(pair[0])
        metrics[name] = bootstrap_change(*pair, statistics, resamples=resamples,
                                         confidence=confidence, seed=seed, paired=True)
    if not metrics:
        raise InputError("A and B share no metric with two requests completed in both")
    ca, cb = _causes(a), _causes(b)
    return {"metrics": metrics, "num_paired": counts,
            "causes": {c: (ca[c], cb[c]) for c in sorted(set(ca) | set(cb))},
            "resamples": resamples, "confidence": confidence, "seed": seed}


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
    lines.append(f"* the interval excludes 0 (paired by trace line, {result['resamples']} "
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
        result = compare(load_result(args.a), load_result(args.b), resamples=args.resamples,
                         confidence=args.confidence, seed=args.seed)
        failures = failed_gates(result, args.fail_if_worse)
    except (InputError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(result), indent=2) if args.json else format_text(result))
    for failure in failures:
        print(f"compare: FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0
