"""Import contracts (.importlinter at the repo root), enforced by running import-linter.

`lint-imports` must pass on the tree as it is, and must fail — naming the broken contract —
when a violating import is injected into a copy of the packages: a linter that never fails
proves nothing."""
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
