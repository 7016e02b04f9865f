"""tools/install_torch.sh and tools/bootstrap_venv.sh as a newcomer's machine meets them: a pip
that sees only its own configuration (no local wheel folder), with the lock's `+cpu` torch
taken from a wheel at hand or from PyTorch's CPU index, and a clear refusal otherwise.

The "torch" here is a tiny stand-in wheel of the same name and version and the index a
loopback PEP 503 folder: the scripts' choices are under test, not PyTorch's download."""
from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALL_TORCH = REPO / "tools/install_torch.sh"
BOOTSTRAP = REPO / "tools/bootstrap_venv.sh"
VERSION = "2.13.0+cpu"


def _stand_in_wheel(folder: Path) -> Path:
    dist_info = f"torch-{VERSION}.dist-info"
    path = folder / f"torch-{VERSION}-py3-none-any.whl"
    files = {
        "torch/__init__.py": f"__version__ = {VERSION!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {VERSION}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{name},,\n" for name in files) + \
        f"{dist_info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # nobody listens once it is closed


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv / "bin/python"


@pytest.fixture
def newcomer_env(tmp_path) -> dict:
    """pip with no configuration file and no local wheels, PyPI's place taken by a closed
    loopback port: any index look-up the script did not mean to make fails the install."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"http://127.0.0.1:{_closed_port()}/",
               PIP_RETRIES="0", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
               TORCH_INDEX_PROBE_TIMEOUT_S="5")
    return env


@pytest.fixture
def lock(tmp_path) -> Path:
    path = tmp_path / "lock.txt"
    path.write_text(f"some-package==1.0\ntorch=={VERSION}\n    # via something\n")
    return path


def _installed_torch(vpy: Path) -> str | None:
    out = subprocess.run([str(vpy), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _uninstall(vpy: Path) -> None:
    subprocess.run([str(vpy), "-m", "pip", "uninstall", "-q", "-y", "torch"],
                   capture_output=True)
    assert _installed_torch(vpy) is None


def test_a_wheel_at_hand_is_taken_without_any_index(venv_python, newcomer_env, lock, tmp_path):
    _uninstall(venv_python)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _stand_in_wheel(wheels)
    env = dict(newcomer_env, PIP_FIND_LINKS=str(wheels),
               TORCH_INDEX_URL=f"http://127.0.0.1:{_closed_port()}/whl/cpu")
    run = subprocess.run([str(INSTALL_TORCH), str(venv_python), str(lock)], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert _installed_torch(venv_python) == VERSION


def test_without_a_wheel_at_hand_pytorchs_index_is_used(venv_python, newcomer_env, lock,
                                                        tmp_path):
    _uninstall(venv_python)
    index = tmp_path / "whl" / "cpu" / "torch"
    index.mkdir(parents=True)
    _stand_in_wheel(index)
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path / "whl"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = dict(newcomer_env, TORCH_INDEX_URL=f"http://127.0.0.1:{server.server_port}/cpu")
        run = subprocess.run([str(INSTALL_TORCH), str(venv_python), str(lock)], env=env,
                             capture_output=True, text=True)
    finally:
        server.shutdown()
        server.server_close()
    assert run.returncode == 0, run.stderr
    assert _installed_torch(venv_python) == VERSION


def test_an_unreachable_index_is_a_clear_error(venv_python, newcomer_env, lock):
    _uninstall(venv_python)
    index = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    run = subprocess.run([str(INSTALL_TORCH), str(venv_python), str(lock)],
                         env=dict(newcomer_env, TORCH_INDEX_URL=index),
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert f"torch=={VERSION} is the CPU build" in run.stderr
    assert index in run.stderr and "PIP_FIND_LINKS" in run.stderr
    assert _installed_torch(venv_python) is None


def test_a_lock_without_torch_is_refused(venv_python, newcomer_env, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("some-package==1.0\n")
    run = subprocess.run([str(INSTALL_TORCH), str(venv_python), str(lock)], env=newcomer_env,
                         capture_output=True, text=True)
    assert run.returncode == 1 and "pins no torch" in run.stderr


@pytest.mark.parametrize("version", ["Python 3.10.12", "Python 3.9.2"])
def test_an_old_python_is_named(tmp_path, version):
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\ncase "$1" in --version) echo "{version}";; *) exit 1;; esac\n')
    fake.chmod(0o755)
    run = subprocess.run([str(BOOTSTRAP), str(fake), str(tmp_path / "venv")],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert f"{version} is too old" in run.stderr and "3.11 or newer" in run.stderr
    assert not (tmp_path / "venv").exists()


def test_a_missing_python_is_named(tmp_path):
    run = subprocess.run([str(BOOTSTRAP), str(tmp_path / "no-such-python"), str(tmp_path / "v")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "not found" in run.stderr and "3.11" in run.stderr


def test_a_good_python_gets_a_venv(tmp_path):
    run = subprocess.run([str(BOOTSTRAP), sys.executable, str(tmp_path / "v")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "v/bin/python").exists()
