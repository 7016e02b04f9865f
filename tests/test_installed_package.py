"""A non-editable install serves /ui, /demo and the probe scripts.

The editable install in the dev venv reads the static files straight from the source tree
(where probe.min.js, probe.global.min.js and demo/ are symlinks into frontend_probe/), so it cannot
catch a file missing from the wheel's package data. This test builds and installs the
project for real into a temporary target, then runs a fresh, isolated interpreter in which
that installed copy is the one imported, mounts the routes the way both fronts do
(`build_observability(...).include_routes(app)`), and checks every static URL byte for byte
against the sources in the repo.

The source tree is copied first (symlinks kept, as in a git checkout; build outputs
dropped) because setuptools builds in-tree: a stale `build/lib` would leak files that the
package data no longer lists into the wheel and hide exactly the regression this test is
for, and the build would write into the working tree.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# URL → the source file whose bytes it must serve (the JS package in frontend_probe/ is the
# source of truth; tracer/web/static/{probe.min.js,probe.global.min.js,demo} link to it).
EXPECTED = {
    "/ui": "tracer/web/static/ui/index.html",   # 307 → /ui/, followed
    "/ui/": "tracer/web/static/ui/index.html",
    "/ui/dom.js": "tracer/web/static/ui/dom.js",
    "/ui/api.js": "tracer/web/static/ui/api.js",
    "/ui/palette.js": "tracer/web/static/ui/palette.js",
    "/ui/requests_table.js": "tracer/web/static/ui/requests_table.js",
    "/ui/attribution.js": "tracer/web/static/ui/attribution.js",
    "/ui/waterfall.js": "tracer/web/static/ui/waterfall.js",
    "/ui/facts.js": "tracer/web/static/ui/facts.js",
    "/ui/verdict.js": "tracer/web/static/ui/verdict.js",
    "/ui/ui.js": "tracer/web/static/ui/ui.js",
    "/ui/timeline.js": "tracer/web/static/ui/timeline.js",
    "/ui/ui.css": "tracer/web/static/ui/ui.css",
    "/demo": "frontend_probe/demo/index.html",
    "/demo/": "frontend_probe/demo/index.html",
    "/demo/demo.js": "frontend_probe/demo/demo.js",
    "/demo/demo.css": "frontend_probe/demo/demo.css",
    # the minified builds are what is served (frontend_probe/build.mjs)
    "/probe/probe.js": "frontend_probe/probe.min.js",
    "/probe/probe.global.js": "frontend_probe/probe.global.min.js",
}
# Installed package data → its source: each must be a regular file in the install.
INSTALLED = {
    "tracer/web/static/ui/index.html": "tracer/web/static/ui/index.html",
    "tracer/web/static/ui/dom.js": "tracer/web/static/ui/dom.js",
    "tracer/web/static/ui/api.js": "tracer/web/static/ui/api.js",
    "tracer/web/static/ui/palette.js": "tracer/web/static/ui/palette.js",
    "tracer/web/static/ui/requests_table.js": "tracer/web/static/ui/requests_table.js",
    "tracer/web/static/ui/attribution.js": "tracer/web/static/ui/attribution.js",
    "tracer/web/static/ui/waterfall.js": "tracer/web/static/ui/waterfall.js",
    "tracer/web/static/ui/facts.js": "tracer/web/static/ui/facts.js",
    "tracer/web/static/ui/verdict.js": "tracer/web/static/ui/verdict.js",
    "tracer/web/static/ui/ui.js": "tracer/web/static/ui/ui.js",
    "tracer/web/static/ui/timeline.js": "tracer/web/static/ui/timeline.js",
    "tracer/web/static/ui/ui.css": "tracer/web/static/ui/ui.css",
    "tracer/web/static/probe.min.js": "frontend_probe/probe.min.js",
    "tracer/web/static/probe.global.min.js": "frontend_probe/probe.global.min.js",
    "tracer/web/static/demo/index.html": "frontend_probe/demo/index.html",
    "tracer/web/static/demo/demo.js": "frontend_probe/demo/demo.js",
    "tracer/web/static/demo/demo.css": "frontend_probe/demo/demo.css",
}
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
    ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", ".test-output",
    ".bench-output")

# Runs in the isolated interpreter: where things were imported from, and every URL's
# status and body.
_CHILD = r"""
import base64, json, sys
from fastapi import FastAPI
from fastapi.testclient import TestClient
import tracer, tracer.web.observability as observability
from tracer.web.observability import ObservabilitySettings, build_observability

obs = build_observability(ObservabilitySettings(tracing=False), model_names=("m",))
app = FastAPI()
obs.include_routes(app)
responses = {}
with TestClient(app) as client:
    for url in json.loads(sys.argv[1]):
        r = client.get(url)
        responses[url] = [r.status_code, base64.b64encode(r.content).decode()]
print(json.dumps({
    "tracer_file": tracer.__file__, "observability_file": observability.__file__,
    "sys_path": sys.path,
    "meta_path": [repr(f) for f in sys.meta_path],
    "editable_modules": sorted(m for m in sys.modules if "__editable__" in m),
    "responses": responses}))
"""


def _run(cmd: list, *, timeout: float, cwd: Path, env: dict | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc.stdout


def install_copy(src_tree: Path, site: Path, *, cwd: Path) -> None:
    """`pip install` (non-editable, no deps, no network) of `src_tree` into `site`."""
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
          "--no-index", "--no-cache-dir", "--no-compile", "--disable-pip-version-check",
          "--quiet", "--target", site, src_tree], timeout=240, cwd=cwd)


def isolated_python(tmp: Path, site: Path) -> Path:
    """A bare venv whose site-packages has one .pth: `site` first, then the dev venv's
    site-packages for the dependencies. Directories named in a .pth are added to sys.path
    but their own .pth files are not run, so the editable install's finder never loads."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=60, cwd=tmp)
    python = venv / "bin" / "python"
    venv_site = Path(_run([python, "-I", "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          timeout=30, cwd=tmp).strip())
    dev = sysconfig.get_paths()
    lines = [str(site)] + list(dict.fromkeys([dev["purelib"], dev["platlib"]]))
    (venv_site / "00-installed-ttftscope.pth").write_text("\n".join(lines) + "\n")
    return python


def test_non_editable_install_serves_static_files(tmp_path):
    assert importlib.util.find_spec("setuptools") is not None, (
        "setuptools is not in the dev venv: `pip install --no-build-isolation` needs it")
    src_tree, site, work = tmp_path / "src", tmp_path / "site", tmp_path / "cwd"
    work.mkdir()
    shutil.copytree(REPO, src_tree, symlinks=True, ignore=_NOT_SOURCES)
    install_copy(src_tree, site, cwd=work)

    # The wheel carried the package data as real files with the sources' bytes.
    for installed, source in INSTALLED.items():
        path = site / installed
        assert path.is_file() and not path.is_symlink(), f"{installed} is not installed"
        assert path.read_bytes() == (REPO / source).read_bytes(), f"{installed} differs"

    python = isolated_python(tmp_path, site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = json.loads(_run([python, "-I", "-c", _CHILD, json.dumps(list(EXPECTED))],
                          timeout=120, cwd=work, env=env))

    # The installed copy is what ran, and nothing of the editable install was loaded.
    assert Path(out["tracer_file"]).is_relative_to(site), out["tracer_file"]
    assert Path(out["observability_file"]).is_relative_to(site), out["observability_file"]
    assert not out["editable_modules"], out["editable_modules"]
    assert not any("_EditableFinder" in f for f in out["meta_path"]), out["meta_path"]
    assert str(REPO) not in out["sys_path"] and str(work) not in out["sys_path"]
    assert out["sys_path"].index(str(site)) < out["sys_path"].index(
        sysconfig.get_paths()["purelib"])

    for url, source in EXPECTED.items():
        status, body = out["responses"][url]
        assert status == 200, f"GET {url} → {status}: {base64.b64decode(body)[:200]!r}"
        assert base64.b64decode(body) == (REPO / source).read_bytes(), f"GET {url}: body differs"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
