"""The Docker build context: .dockerignore leaves out local state (virtualenvs, git history,
caches, test and bench outputs) and keeps every file the Dockerfile COPYs.

The patterns are read with Docker's rules as far as this file uses them: a pattern is
matched against the path from the context's root, `*` and `?` stay within one path
segment, `**` spans any number of them, a path is out when it or a folder above it
matches, and the last matching pattern wins (`!` puts a path back)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        rules.append((keep, _regex(line.lstrip("!").strip("/"))))
    return rules


def excluded(path: str, rules=None) -> bool:
    rules = _rules() if rules is None else rules
    parts = path.split("/")
    out = False
    for keep, rx in rules:
        if any(rx.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            out = not keep
    return out


def _copied_sources() -> list[str]:
    sources = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words):
            continue            # from another stage, not the context
        sources += args[:-1]
    return sources


def test_the_matcher_reads_patterns_as_docker_does():
    rules = [(False, _regex("**/node_modules")), (False, _regex(".git")),
             (False, _regex("*.md")), (True, _regex("README.md"))]
    assert excluded("node_modules/x.js", rules)
    assert excluded("frontend_probe/node_modules/esbuild/bin", rules)
    assert excluded(".git/HEAD", rules)
    assert not excluded("docs/.git", rules)         # no **: the root only
    assert excluded("NOTES.md", rules) and not excluded("README.md", rules)
    assert not excluded("guide/NOTES.md", rules)    # * stays within one segment


def test_every_file_the_dockerfile_copies_is_in_the_context():
    sources = _copied_sources()
    assert "pyproject.toml" in sources and "tracer" in sources
    rules = _rules()
    tracked = subprocess.run(["git", "ls-files", "--", *sources], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.split()
    assert tracked
    assert [f for f in tracked if excluded(f, rules)] == []


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".git/HEAD", "frontend_probe/node_modules/esbuild/package.json",
    "tracer/__pycache__/cli.cpython-311.pyc", "tracer/web/__pycache__/x.pyc",
    ".pytest_cache/v/cache/nodeids", ".hypothesis/examples/x", ".bench-output/summary.json",
    ".test-output/x.log", "ttftscope.egg-info/PKG-INFO", "build/lib/tracer/__init__.py",
])
def test_local_state_is_left_out(path):
    assert excluded(path)
