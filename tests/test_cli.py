"""The `ttftscope` console command: every command is there, `serve` is the engine's parser and
the rest the tracer's, and without the engine extra the proxy still serves while `serve` says
which package is missing (ttftscope/cli.py)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ttftscope.cli import ENGINE_EXTRA_MODULES

REPO = Path(__file__).resolve().parents[1]
# The venv's console script, next to the interpreter running the tests (`pip install -e .`
# writes it from pyproject.toml's [project.scripts]).
TTFTSCOPE = Path(sys.executable).parent / "ttftscope"
COMMANDS = ("serve", "proxy", "collect", "bench", "diagnose", "trace", "compare")
# A process in which the engine extra cannot be imported, as after `pip install ttftscope`:
# a None in sys.modules makes `import torch` raise ModuleNotFoundError.
WITHOUT_ENGINE_EXTRA = (
    "import sys\n"
    f"for name in {sorted(ENGINE_EXTRA_MODULES)!r}: sys.modules[name] = None\n"
    "from ttftscope.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")


def _run(*argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)


def test_help_lists_every_command():
    assert TTFTSCOPE.is_file(), f"{TTFTSCOPE} missing: pip install -e '.[engine,dev]'"
    run = _run(TTFTSCOPE, "--help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: ttftscope")
    for command in COMMANDS:
        assert f"    {command}" in run.stdout, (command, run.stdout)


def test_serve_is_the_engines_parser_and_the_rest_the_tracers():
    serve = _run(TTFTSCOPE, "serve", "--help")
    assert serve.returncode == 0, serve.stderr
    assert serve.stdout.startswith("usage: ttftscope serve") and "--step-log-size" in serve.stdout
    proxy = _run(sys.executable, "-m", "ttftscope", "proxy", "--help")
    assert proxy.returncode == 0, proxy.stderr
    assert proxy.stdout.startswith("usage: ttftscope proxy") and "--upstream" in proxy.stdout
    unknown = _run(TTFTSCOPE, "nosuch")
    assert unknown.returncode == 2 and "invalid choice: 'nosuch'" in unknown.stderr


def test_serve_without_the_engine_extra_names_what_to_install():
    run = _run(sys.executable, "-c", WITHOUT_ENGINE_EXTRA, "serve", "--port", "1")
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "pip install 'ttftscope[engine]'" in run.stderr and "Traceback" not in run.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_proxy_serves_without_the_engine_extra():
    port, upstream = _free_port(), f"http://127.0.0.1:{_free_port()}"   # nothing listens there
    process = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_ENGINE_EXTRA, "proxy", "--upstream", upstream,
         "--served-model-name", "m", "--listen", f"127.0.0.1:{port}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, metrics = time.monotonic() + 60, None
        while metrics is None and process.poll() is None and time.monotonic() < deadline:
            try:
                metrics = httpx.get(base + "/metrics", timeout=2)
            except httpx.TransportError:
                time.sleep(0.05)    # polling for a child process to listen: no event to wait on
        assert metrics is not None and metrics.status_code == 200, process.stderr.read()
        # The request is traced and answered in the OpenAI error shape: the upstream is down.
        answer = httpx.post(base + "/v1/chat/completions", timeout=30, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["type"]
    finally:
        process.terminate()
        process.wait(timeout=30)
