"""Import contracts (.importlinter at the repo root), enforced by running import-linter.

`lint-imports` must pass on the tree as it is, and must fail — naming the broken contract —
when a violating import is injected into a copy of the packages: a linter that never fails
proves nothing. No module may reach itself through imports (import-linter has no contract for
that): a cycle makes import order matter and the two modules one concept in two files."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import grimp
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ".importlinter"
PACKAGES = ("tracer", "instrumented_engine")
# The venv's console script, next to the interpreter running the tests.
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"

RECORD_STDLIB_ONLY = "tracer.record and tracer.core are standard library only"
ENGINE_UNTRACED = "engine and model import no tracer, telemetry or web framework"


def _lint_imports(cwd: pathlib.Path, extra_env: dict[str, str] | None = None):
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} missing: install the dev extra (pip install -e '.[dev]')")
    # Wide columns: rich wraps long contract names at 80 columns when not on a terminal.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(extra_env or {})}
    # --no-cache: nothing written into the tree, and a copy is never judged by a stale graph.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", CONFIG],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def test_lint_imports_passes_on_the_tree():
    result = _lint_imports(REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"lint-imports failed (exit {result.returncode}):\n{output}"
    assert "0 broken" in output, output


def test_record_and_core_import_only_the_standard_library():
    """The forbidden contract lists third-party packages by name; this catches any other."""
    graph = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    offenders = []
    for package in ("tracer.record", "tracer.core"):
        for module in sorted({package} | graph.find_descendants(package)):
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                if imported.split(".")[0] in PACKAGES:
                    continue  # tracer-internal layering is the layers contract's job
                if imported.split(".")[0] not in sys.stdlib_module_names:
                    lines = graph.get_import_details(importer=module, imported=imported)
                    where = ", ".join(f"l.{d['line_number']}" for d in lines)
                    offenders.append(f"{module} -> {imported} ({where})")
    assert not offenders, "non-stdlib imports in tracer.record/tracer.core:\n" + "\n".join(
        offenders)


@pytest.mark.parametrize(
    ("path", "injected", "contract", "chain"),
    [
        pytest.param("tracer/record/stages.py", "import prometheus_client", RECORD_STDLIB_ONLY,
                     "tracer.record.stages -> prometheus_client", id="record-imports-prometheus"),
        pytest.param("instrumented_engine/engine/scheduler.py", "import tracer", ENGINE_UNTRACED,
                     "instrumented_engine.engine.scheduler -> tracer", id="engine-imports-tracer"),
    ],
)
def test_injected_violation_breaks_its_contract(tmp_path, path, injected, contract, chain):
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / CONFIG, tmp_path / CONFIG)
    target = tmp_path / path
    target.write_text(target.read_text() + f"\n{injected}\n")

    # The copies, not the editable install, must be analysed: cwd and PYTHONPATH both point
    # at tmp_path (the editable finder comes after sys.path entries).
    result = _lint_imports(tmp_path, {"PYTHONPATH": str(tmp_path)})
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"lint-imports passed despite `{injected}` in {path}:\n{output}"
    assert any(contract in line and "BROKEN" in line for line in output.splitlines()), output
    assert chain in output, output


def import_cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """One cycle per strongly connected component of the module graph (Tarjan's algorithm,
    iterative: the graph is deeper than Python's recursion limit allows for), each as the
    chain `m -> ... -> m`. Lazy and TYPE_CHECKING imports count: grimp records them all."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    work: list = []   # (module, its importees not yet followed): the recursion's frames

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        work.append((module, iter(sorted(graph.find_modules_directly_imported_by(module)))))

    for root in sorted(graph.modules):
        if root in index:
            continue
        visit(root)
        while work:
            module, importees = work[-1]
            for imported in importees:
                if imported not in index:
                    visit(imported)
                    break
                if imported in on_stack:
                    low[module] = min(low[module], index[imported])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while (member := stack.pop()) != module:
                        on_stack.discard(member)
                        component.append(member)
                    on_stack.discard(module)
                    components.append([module, *component])
    cycles = []
    for component in components:
        if len(component) == 1:
            continue
        start = min(component)
        step = min(set(component) & graph.find_modules_directly_imported_by(start))
        cycles.append((start, *graph.find_shortest_chain(importer=step, imported=start)))
    return cycles


def test_no_import_cycles():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 100   # the packages were found, not an empty graph
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_a_cycle_is_reported(tmp_path, monkeypatch):
    package = tmp_path / "cyclic_fixture_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic_fixture_pkg import b\n")
    (package / "b.py").write_text("def f():\n    from cyclic_fixture_pkg.c import g\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cyclic_fixture_pkg.a\n")
    (package / "leaf.py").write_text("import cyclic_fixture_pkg.a\n")   # into it, not on it
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic_fixture_pkg", cache_dir=None)
    assert import_cycles(graph) == [
        ("cyclic_fixture_pkg.a", "cyclic_fixture_pkg.b", "cyclic_fixture_pkg.c",
         "cyclic_fixture_pkg.a")]
