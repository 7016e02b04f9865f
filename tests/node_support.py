"""Runs an ES module script under Node from frontend_probe/, where the pinned npm packages
(`openai`, `ai`, playwright-core) and the probe's own modules resolve: the tests that check
a JavaScript client or the probe's rules against the same fixtures as Python."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

FRONTEND_PROBE = Path(__file__).resolve().parents[1] / "frontend_probe"


def run_node(script: str, *args: str, stdin: str | None = None,
             timeout_s: float = 120) -> str:
    """The script's stdout; fails the test, with the script's stderr, when it exits non-zero
    or naming the fix when Node is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is missing: apt-get install -y nodejs")
    run = subprocess.run([node, "--input-type=module", "-e", script, *args], input=stdin,
                         capture_output=True, text=True, timeout=timeout_s, cwd=FRONTEND_PROBE)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout
