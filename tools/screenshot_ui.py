"""Regenerates the README's picture, docs/img/ui.png: `/ui` on a real request, not a mock-up.

    .venv/bin/python tools/screenshot_ui.py                          # docs/img/ui.png
    .venv/bin/python tools/screenshot_ui.py --out /tmp/ui.png --width 1280 --height 960

It starts the engine (`python -m instrumented_engine serve`, the packaged SmolLM2, on a free
loopback port) and waits for `/health`; tools/screenshot_ui.mjs then sends one long prompt
and, during its prefill, two short ones (one typed into `/demo`, so the browser probe joins
it), opens `/ui/#trace=<that short one>` in headless Chromium once the page has drawn its
waterfall, verdict, timeline and neighbours, and saves the viewport as a PNG of exactly
--width x --height. The engine is stopped whatever happens.

Needs what `make test` installs: node, Chromium at /usr/bin/chromium and playwright-core in
frontend_probe/node_modules (`cd frontend_probe && npm ci`; NODE_PATH is looked in too).
Standard library only; the numbers in the picture are this machine's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tools" / "screenshot_ui.mjs"
CHROMIUM = Path("/usr/bin/chromium")


def fail(message: str) -> None:
    raise SystemExit(f"screenshot_ui: {message}")


def node_or_fail() -> str:
    """node, with Chromium and playwright-core where the driver looks; else exit naming the fix."""
    node = shutil.which("node")
    if node is None:
        fail("node is missing: apt-get install -y nodejs (Node 20)")
    if not CHROMIUM.exists():
        fail(f"Chromium is missing at {CHROMIUM}: apt-get install -y chromium")
    places = [ROOT / "frontend_probe" / "node_modules"]
    places += [Path(p) for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
    if not any((p / "playwright-core").is_dir() for p in places):
        fail("playwright-core is missing: cd frontend_probe && npm ci")
    return node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> tuple[int, dict | None]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:      # 503 while the engine warms up
        return e.code, None
    except (urllib.error.URLError, OSError):
        return 0, None


def wait_healthy(base: str, engine: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.poll() is not None:
            fail(f"the engine exited {engine.returncode}:\n"
                 f"{log.read_text(errors='replace')[-3000:]}")
        if get_json(base + "/health")[0] == 200:
            return
        time.sleep(0.5)
    fail(f"the engine was not healthy within {timeout_s:.0f} s (log: {log})")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def screenshot(out: Path, width: int, height: int, timeout_s: float) -> dict:
    node = node_or_fail()
    out.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="ttftscope-screenshot-") as tmp:
        log = Path(tmp) / "engine.log"
        # The checkout's own code first, whatever the environment has installed.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        with open(log, "wb") as sink:
            engine = subprocess.Popen(
                [sys.executable, "-m", "instrumented_engine", "serve", "--host", "127.0.0.1",
                 "--port", str(port)], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            started = time.monotonic()
            wait_healthy(base, engine, log, timeout_s)
            model = get_json(base + "/v1/models")[1]["data"][0]["id"]
            left_ms = max(timeout_s - (time.monotonic() - started), 60) * 1000
            opts = {"baseUrl": base, "model": model, "out": str(out.resolve()), "width": width,
                    "height": height, "timeoutMs": left_ms}
            run = subprocess.run([node, str(DRIVER), json.dumps(opts)], cwd=ROOT,
                                 capture_output=True, text=True, timeout=left_ms / 1000 + 60)
            if run.returncode != 0:
                fail(f"the browser driver failed:\n{run.stderr[-3000:]}")
            result = json.loads(run.stdout.strip().splitlines()[-1])
        finally:
            stop(engine)
    if result["pageErrors"]:
        fail(f"the page reported errors: {result['pageErrors']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "ui.png")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=960)   # the whole waterfall
    parser.add_argument("--timeout-s", type=float, default=480,
                        help="for everything: the engine's start, the requests, the page")
    args = parser.parse_args(argv)
    result = screenshot(args.out, args.width, args.height, args.timeout_s)
    print(f"{args.out}: /ui on trace {result['traceId']} ({result['verdict']['cause']}; "
          f"browser joined: {result['clientJoined']}; "
          f"{len(result['neighbours'])} neighbour row(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
