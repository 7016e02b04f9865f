"""bench/tracer_cost_ab.py at a tiny size: this checkout and a worktree of HEAD, alternated;
one line per run, then each tree's medians and its paired ratios to the first; the worktree
is gone afterwards."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402

FIGURES = ("serving", "worker", "store_writer", "serving_no_diagnosis", "worker_no_diagnosis")


def worktrees() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "worktree", "list", "--porcelain"],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("worktree ")]


def test_two_trees_alternate_and_the_ratios_are_to_the_first():
    before = worktrees()
    out = run_bench_script("tracer_cost_ab.py", ".", "HEAD", "--rounds", "2", "--requests",
                           "40", timeout_s=600)
    runs = [line.split() for line in out.splitlines() if line.startswith("round ")]
    assert [r[2] for r in runs] == [".", "HEAD", "HEAD", "."], out     # the order reversed
    for run in runs:
        values = dict(zip(run[3::2], map(float, run[4::2])))
        assert list(values) == list(FIGURES) and all(v > 0 for v in values.values()), run
    summary = {line.split()[0]: line for line in out.splitlines()[-2:]}
    assert set(summary) == {".", "HEAD"}, out
    first = re.findall(r"(\w+)\s+([\d.]+) \(([\d.]+)\)", summary["."])
    assert [name for name, _, _ in first] == list(FIGURES)
    assert all(ratio == "1.00" for _, _, ratio in first), summary["."]
    assert len(re.findall(r"\(([\d.]+)\)", summary["HEAD"])) == len(FIGURES)
    assert worktrees() == before
    rows = run_all.parse_tracer_cost_ab(out)         # what `make bench` tabulates
    assert [row[0].split(":")[0] for row in rows] == ["tracer cost at .", "tracer cost at HEAD"]
