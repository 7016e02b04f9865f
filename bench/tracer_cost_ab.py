"""The tracer's own cost in several trees at once: `bench/tracer_cost.py` run in each, round
after round, the order reversed every other round, so that a busy machine's drift hits them
alike (the guard against drift of issue "The sidecar's own price").

    .venv/bin/python bench/tracer_cost_ab.py BEFORE AFTER [MORE ...] [--rounds 5]
                                             [--store sqlite|memory] [--requests 2000]

Each tree is a commit (checked out into a temporary worktree, removed at the end) or a folder
holding a checkout (`.` is this one, as it is now). A tree runs its own
`bench/tracer_cost.py`, which must take `--store` (added at `b04291a`): for an older commit,
make a worktree yourself, copy a newer script in, and pass its folder. The figures are the
script's (µs per request, each its run's best batch): the serving thread and the worker
(with `--store sqlite`, the store writer's thread included), with the diagnosis on and off.
Printed: one line per run, then for each tree the median over rounds and the median of its
paired ratios to the first tree (the runs of one round, side by side).
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIGURES = {
    "serving": r"per request \(1 token\):\s+([\d.]+)",
    "worker": r"background worker:\s+([\d.]+)",
    "store_writer": r"writer thread ([\d.]+)",
    "serving_no_diagnosis": r"serving thread [\d.]+ / ([\d.]+)",
    "worker_no_diagnosis": r"worker [\d.]+ / ([\d.]+)",
}


def figures(output: str) -> dict[str, float]:
    """The figures one run of bench/tracer_cost.py printed (NaN where a line is missing).

    >>> out = ("per request (1 token):      27.4 µs\\nbackground worker:         208.3 µs CPU\\n"
    ...        "store:                   sqlite, writer thread 31.7 µs CPU per request\\n"
    ...        "diagnosis on/off, interleaved: serving thread 27.4 / 23.2 µs (x), worker 208.3 / 150.1 µs")
    >>> figures(out)["worker_no_diagnosis"], figures(out)["store_writer"]
    (150.1, 31.7)
    """
    found = {name: re.search(pattern, output) for name, pattern in FIGURES.items()}
    return {name: float(m.group(1)) if m else float("nan") for name, m in found.items()}


def checkout(tree: str, scratch: Path) -> Path:
    """A folder holding `tree`: itself when it is one, else a worktree of that commit."""
    if Path(tree, "bench", "tracer_cost.py").is_file():
        return Path(tree).resolve()
    folder = scratch / re.sub(r"[^\w.-]", "_", tree)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), tree],
                   check=True, capture_output=True)
    return folder


def run_once(folder: Path, store: str, requests: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(folder / "bench" / "tracer_cost.py"),
                          "--requests", str(requests), "--store", store],
                         capture_output=True, text=True, check=True).stdout
    return figures(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="commits or checkout folders; the first is "
                                                  "the one the ratios are to")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    if len(set(args.trees)) != len(args.trees):
        parser.error("each tree once")
    with tempfile.TemporaryDirectory(prefix="tracer-cost-ab-") as scratch:
        folders = [checkout(tree, Path(scratch)) for tree in args.trees]
        try:
            runs = {tree: [] for tree in args.trees}
            for r in range(args.rounds):
                order = list(zip(args.trees, folders))
                for tree, folder in order if r % 2 == 0 else order[::-1]:
                    found = run_once(folder, args.store, args.requests)
                    runs[tree].append(found)
                    print(f"round {r} {tree:>12s} " + "  ".join(
                        f"{k} {v:7.1f}" for k, v in found.items()), flush=True)
        finally:
            for folder in folders:
                if Path(scratch) in folder.parents:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(folder)], capture_output=True)
    first = runs[args.trees[0]]
    print(f"µs per request, median of {args.rounds} rounds (paired ratio to {args.trees[0]}), "
          f"--store {args.store}")
    for tree in args.trees:
        line = []
        for name in FIGURES:
            median = statistics.median(run[name] for run in runs[tree])
            ratio = statistics.median(a[name] / b[name] for a, b in zip(runs[tree], first))
            line.append(f"{name} {median:7.1f} ({ratio:.2f})")
        print(f"{tree:>12s}  " + "  ".join(line))


if __name__ == "__main__":
    main()
