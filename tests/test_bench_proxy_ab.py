"""bench/proxy_ab.py at a tiny size: nginx, a proxy of this checkout and one of a worktree of
HEAD, loaded in turn; one line per round, then each tree's median and its paired ratios to the
first tree and to nginx; the worktree is gone afterwards."""
from __future__ import annotations

import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402
from bench_script import run_bench_script  # noqa: E402
from test_bench_tracer_cost_ab import worktrees  # noqa: E402


def test_two_trees_and_nginx_each_a_figure_a_round_and_ratios_to_the_first():
    before = worktrees()
    out = run_bench_script("proxy_ab.py", ".", "HEAD", "--rounds", "2", "--requests", "8",
                           "--chunks", "4", "--concurrency", "4", timeout_s=300)
    rounds = [line.split() for line in out.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2, out
    for run in rounds:
        values = dict(zip(run[2::2], map(float, run[3::2])))
        assert list(values) == ["nginx", ".", "HEAD"] and all(v > 0 for v in values.values()), run
    rows = {m[1]: m for m in re.finditer(
        r"^\s+(\S+)\s+([\d.]+)(?:\s+([\d.]+) \(([\d.]+)-([\d.]+)\)\s+([\d.]+)x "
        r"\(([\d.]+)-([\d.]+)\))?$", out, re.M)}
    assert set(rows) == {"nginx", ".", "HEAD"}, out
    assert rows["."][3] == rows["."][4] == rows["."][5] == "1.000", out   # the first tree
    low, median, high = float(rows["HEAD"][4]), float(rows["HEAD"][3]), float(rows["HEAD"][5])
    assert 0 < low <= median <= high, out
    for tree in (".", "HEAD"):   # a proxy spends more than nginx on the same streams
        low, median, high = (float(rows[tree][i]) for i in (7, 6, 8))
        assert 1 < low <= median <= high, out
    assert worktrees() == before
    rows = run_all.parse_proxy_ab(out)               # what `make bench` tabulates
    assert [row[0].split(",")[0] for row in rows] == ["proxy CPU a request at .",
                                                      "proxy CPU a request at HEAD"], rows
