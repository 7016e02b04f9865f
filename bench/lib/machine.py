"""What a bench run ran on, for bench/run_all.py's summary: every figure depends on the CPU.

The engine picks its formats from torch's CPU capability (docs/reference.md, "Engine weight
formats"), so the summary names it beside the CPU's model and whether it has AVX-512
(`avx512f`); the date and the commit say which code was measured. Standard library only:
torch is asked in a child process, so `run_all.py --list` and its tests never import it.

>>> info = describe(None)
>>> sorted(info) == sorted(FIELDS)
True
>>> info["torch_cpu_capability"]
'not asked'
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("cpu_model", "avx512f", "logical_cpus", "torch_cpu_capability", "torch_version",
          "python_version", "system", "date_utc", "git_commit", "git_dirty")
# One per line: a capability may hold a space ("Z VECTOR", "NO AVX").
TORCH_QUERY = ("import torch; print(torch.backends.cpu.get_cpu_capability()); "
               "print(torch.__version__)")


def _run(argv: list[str], timeout_s: float = 60) -> str | None:
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _lscpu() -> dict[str, str]:
    fields = {}
    for line in (_run(["lscpu"]) or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _cpuinfo(key: str) -> str | None:
    """The first `key` line of /proc/cpuinfo (where lscpu is missing)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def describe(python: str | None) -> dict:
    """The machine and the checkout; `python` (None: not asked) is asked for torch's view."""
    lscpu = _lscpu()
    flags = (lscpu.get("Flags") or _cpuinfo("flags") or "").split()
    torch_out = (_run([python, "-c", TORCH_QUERY]) or "").splitlines() if python else []
    commit = (_run(["git", "rev-parse", "--short", "HEAD"]) or "").strip()
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "cpu_model": lscpu.get("Model name") or _cpuinfo("model name") or "unknown",
        "avx512f": "avx512f" in flags if flags else None,
        "logical_cpus": len(os.sched_getaffinity(0)),
        "torch_cpu_capability": torch_out[0] if torch_out else
        ("not asked" if python is None else "unknown (torch did not answer)"),
        "torch_version": torch_out[1] if len(torch_out) > 1 else None,
        "python_version": platform.python_version(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": commit or None,
        "git_dirty": bool(status.strip()) if status is not None else None,
    }
