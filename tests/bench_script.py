"""A bench script run the way the bench tests run it: its stdout on success; on failure an
assertion quoting its exit status, stdout and the tail of its stderr. (`check=True` raises a
`CalledProcessError` that gives the status alone, and a failure in CI then says nothing.)"""
from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_bench_script(name: str, *flags: str, timeout_s: float, env: dict | None = None) -> str:
    """`python bench/<name> <flags>` from the repo root."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / name), *flags],
                          capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env)
    assert done.returncode == 0, (f"bench/{name} exited {done.returncode}\n--- stdout\n"
                                  f"{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")
    return done.stdout
