"""The proxy's CPU per request in several trees at once, beside nginx: one proxy of each tree
and one nginx in front of one fake upstream, loaded in turn, round after round, the order
reversed every other round, so that a busy machine's drift hits them alike (the guard
against drift of issue "The sidecar's own price", for the proxy as
`bench/tracer_cost_ab.py` is for the tracer).

    .venv/bin/python bench/proxy_ab.py BEFORE AFTER [MORE ...] [--rounds 6] [--chunks 64]
                                       [--concurrency 8] [--requests 64] [--no-export]

Each tree is a commit (checked out into a temporary worktree, removed at the end) or a folder
holding a checkout (`.` is this one, as it is now); each runs its own `python -m tracer
proxy`, started as `bench/proxy_overhead.py` starts its proxy (SQLite store in the run's
temporary folder, spans exported to a local sink unless `--no-export`). A batch is
`--requests` streams of `--chunks` content events (plus the role and the end events) at
`--concurrency`, staggered as proxy_overhead's are; its figure is the relaying process's CPU
(all threads; nginx: its worker's) over the batch, per completed request.

Printed: one line per round, then for each tree the median µs per request, the median of
its paired ratios to the first tree (the runs of one round side by side) with their range,
and the median of its paired ratios to nginx with their range.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # bench.lib, when run as `python bench/proxy_ab.py`

import proxy_overhead as po  # noqa: E402
from bench.lib.process_cpu import process_cpu_s  # noqa: E402
from bench.lib.proxy_report import Target  # noqa: E402
from bench.lib.span_sink import nginx_binary, span_sink  # noqa: E402
from bench.lib.stream_client import run_batch  # noqa: E402
from tracer_cost_ab import checkout  # noqa: E402

NGINX = "nginx"


def cpu_per_request_us(target: Target, args) -> float:
    """One batch through `target`: its process's CPU per completed request, in µs."""
    stream_s = args.chunks * args.gap_ms / 1e3
    before = process_cpu_s(target.cpu_pid)
    batch = asyncio.run(run_batch(target.port, args.concurrency, args.requests,
                                  stream_s / args.concurrency, stream_timeout_s=30 + 4 * stream_s))
    if batch.num_failed or not batch.ttft_ms:
        raise SystemExit(f"{target.name}: {batch.num_failed} of {args.requests} streams failed")
    return (process_cpu_s(target.cpu_pid) - before) / len(batch.ttft_ms) * 1e6


def summary(runs: dict[str, list[float]], trees: list[str]) -> list[str]:
    """The closing lines: medians and paired ratios (to the first tree, and to nginx).

    >>> runs = {"nginx": [100.0, 110.0], "a": [250.0, 300.0], "b": [240.0, 270.0]}
    >>> print("\\n".join(summary(runs, ["a", "b"])))
    µs per request, median of 2 rounds; paired ratios: to a (range), to nginx (range)
           nginx    105.0
               a    275.0  1.000 (1.000-1.000)  2.61x (2.50-2.73)
               b    255.0  0.930 (0.900-0.960)  2.43x (2.40-2.45)
    """
    first = runs[trees[0]]
    lines = [f"µs per request, median of {len(first)} rounds; paired ratios: to {trees[0]} "
             f"(range), to nginx (range)"]
    if NGINX in runs:
        lines.append(f"{NGINX:>12s}  {statistics.median(runs[NGINX]):7.1f}")
    for tree in trees:
        ratios = [a / b for a, b in zip(runs[tree], first)]
        line = (f"{tree:>12s}  {statistics.median(runs[tree]):7.1f}  "
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        if NGINX in runs:
            to_nginx = [a / b for a, b in zip(runs[tree], runs[NGINX])]
            line += (f"  {statistics.median(to_nginx):.2f}x "
                     f"({min(to_nginx):.2f}-{max(to_nginx):.2f})")
        lines.append(line)
    return lines


def measure(args, folders: list[Path], tmp: Path, traces_url: str) -> dict[str, list[float]]:
    """nginx (when installed) and one proxy per tree, loaded round after round; each
    target's CPU per request in each round after the warm-up."""
    processes = []
    try:
        upstream_port, upstream = po.start_upstream(args, tmp)
        processes.append(upstream)
        targets = []
        nginx = nginx_binary()
        if nginx is not None:
            targets.append(po.start_nginx(nginx, upstream_port, tmp))
            processes.append(targets[-1].process)
        for i, (tree, folder) in enumerate(zip(args.trees, folders)):
            port, proc = po.start_proxy(f"proxy-{i}", upstream_port, args.concurrency, tmp,
                                        None if args.no_export else traces_url, root=folder)
            processes.append(proc)
            targets.append(Target(tree, port, proc, proc.pid))
        runs = {t.name: [] for t in targets}
        for r in range(args.rounds + 1):   # round 0 warms every path up
            for target in targets if r % 2 else targets[::-1]:
                figure = cpu_per_request_us(target, args)
                if r:
                    runs[target.name].append(figure)
            if r:
                print(f"round {r} " + "  ".join(f"{t.name} {runs[t.name][-1]:7.1f}"
                                                for t in targets), flush=True)
        return runs
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="commits or checkout folders; the first is "
                                                  "the one the ratios are to")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--chunks", type=int, default=64, help="content events per stream")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="between content events")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="streams per batch")
    parser.add_argument("--no-export", action="store_true", help="no OTLP exporter: no spans")
    args = parser.parse_args(argv)
    if len(set(args.trees)) != len(args.trees) or NGINX in args.trees:
        parser.error(f"each tree once, and none named {NGINX}")
    with tempfile.TemporaryDirectory(prefix="proxy-ab-") as scratch:
        tmp = Path(scratch)
        folders = [checkout(tree, tmp) for tree in args.trees]
        try:
            with span_sink(tmp) as traces_url:
                runs = measure(args, folders, tmp, traces_url)
        finally:
            for folder in folders:
                if tmp in folder.parents:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(folder)], capture_output=True)
    print(f"{args.requests} streams of {args.chunks + 2} events at concurrency "
          f"{args.concurrency} a batch; {'no exporter' if args.no_export else 'spans exported'}")
    print("\n".join(summary(runs, args.trees)))


if __name__ == "__main__":
    sys.exit(main())
