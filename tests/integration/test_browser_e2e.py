"""Real headless Chromium: /demo chat → probe beacon → joined trace → /ui waterfall screenshot.

Needs the Debian `chromium` package and npm `playwright-core` (a devDependency of
frontend_probe/, installed by `make test`); without them the test fails, naming the fix.
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import threading
import time
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest

from tracer.record.stages import CLIENT_STAGES, SERVER_STAGES

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("browser_driver.mjs")
CHROMIUM = Path("/usr/bin/chromium")
# Colours of the UI's stage palette (tracer/web/static/ui/palette.js COLORS): the attribution legend's
# swatches are solid squares of each, so a rendered page must contain every one.
PALETTE = {"receive": "7c8db5", "template": "a47fd1", "tokenize": "d17fb4",
           "kv_lookup": "e0a040", "queue": "e06c5a", "prefill": "3f7fd9", "sample": "2aa198",
           "detokenize": "5bb04f", "send": "9c7a45"}


def _require_browser_stack() -> str:
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium chromium-driver")
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is missing: apt-get install -y nodejs npm")
    if not (REPO / "frontend_probe" / "node_modules" / "playwright-core").is_dir():
        pytest.fail("npm playwright-core is missing: cd frontend_probe && npm install")
    return node


def decode_png(path: Path) -> np.ndarray:
    """(height, width, channels) uint8 pixels of an 8-bit, non-interlaced RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    width, height, depth, color_type, _, _, interlace = header
    assert depth == 8 and color_type in (2, 6) and interlace == 0, header
    channels = 3 if color_type == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, -1)
    return _unfilter(raw[:, 0], raw[:, 1:].astype(np.int32), channels).reshape(height, width, channels)


def _unfilter(kinds: np.ndarray, rows: np.ndarray, bpp: int) -> np.ndarray:
    out = np.zeros_like(rows)
    prev = np.zeros(rows.shape[1], np.int32)
    for y, kind in enumerate(kinds):
        line = rows[y]
        if kind in (0, 2):                       # None, Up: no dependence along the row
            cur = (line + (prev if kind == 2 else 0)) & 0xFF
        elif kind == 1:                          # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(-1, bpp), axis=0).reshape(-1) & 0xFF
        else:                                    # Average, Paeth: byte by byte
            cur = _unfilter_slow(int(kind), line.tolist(), prev.tolist(), bpp)
        out[y], prev = cur, cur
    return out.astype(np.uint8)


def _unfilter_slow(kind: int, line: list, prev: list, bpp: int) -> np.ndarray:
    cur = [0] * len(line)
    for i, x in enumerate(line):
        a = cur[i - bpp] if i >= bpp else 0
        b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
        if kind == 3:
            cur[i] = (x + (a + b) // 2) & 0xFF
        else:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            cur[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return np.array(cur, np.int32)


def _colours(pixels: np.ndarray) -> set[str]:
    rgb = pixels[..., :3].reshape(-1, 3).astype(np.uint32)
    packed = np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2])
    return {f"{int(v):06x}" for v in packed}


def _wait_for_client(store, trace_id: str, timeout_s: float = 30.0):
    """The record once its beacon is joined (the driver already waited on the same thing)."""
    deadline, wake = time.monotonic() + timeout_s, threading.Event()
    while time.monotonic() < deadline:
        record = store.get(trace_id)
        if record is not None and record.client is not None:
            return record
        wake.wait(0.05)
    return store.get(trace_id)


def test_demo_chat_in_chromium_joins_the_beacon_and_draws_the_waterfall(server_factory):
    node = _require_browser_stack()
    live = server_factory()
    out_dir = REPO / ".test-output" / "browser_e2e"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    opts = {"baseUrl": live.base_url, "outDir": str(out_dir), "maxTokens": 8,
            "prompt": "What is the capital of France?", "timeoutMs": 150_000,
            "expectEngineInfo": True}
    run = subprocess.run([node, str(DRIVER), json.dumps(opts)], capture_output=True, text=True,
                         timeout=240, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["pageErrors"] == [] and result["answer"].strip(), result
    assert result["clientJoined"], "the probe beacon never reached the store"

    record = _wait_for_client(live.parts.obs.store, result["traceId"])
    client = record.client
    assert [s.stage for s in record.stages] == list(SERVER_STAGES)
    assert record.unattributed_ns == 0 and record.finish_reason in ("stop", "length")
    assert [s["stage"] for s in client["stages"]] == list(CLIENT_STAGES)
    assert client["outcome"] == "ok" and client["status"] == 200 and client["chunks"] >= 1
    # Causality: the browser cannot see the first token before the server had it ready to
    # send. (The `send` mark itself is read when the handler resumes after the ASGI send
    # returned; on a loaded 2-core machine that trails the browser's receipt by as much as
    # 26 ms in one CI run, so the bound is the ready mark, not TTFT less a guessed margin.)
    ready_ns = record.ttft_ns - record.stage_ns("send")
    assert client["client_ttft_ms"] >= ready_ns / 1e6, "the browser saw it before it was ready"
    # Network + gateway = client − server TTFT: by the same causal bound, never below −send.
    assert client["network_overhead_ms"] >= -record.stage_ns("send") / 1e6
    assert client["clock"]["uncertainty_ms"] >= 0
    # The aligned fetch() starts before the server saw the request, and the browser's first
    # token comes after the server sent it.
    assert client["stages"][0]["start_ns"] <= record.start_ns + client["clock"]["uncertainty_ms"] * 1e6
    span_names = {s.name for s in live.spans.get_finished_spans()
                  if f"{s.context.trace_id:032x}" == record.trace_id}
    assert {"client", *CLIENT_STAGES, f"chat {live.model}"} <= span_names

    pixels = decode_png(Path(result["screenshots"]["ui"]))
    colours = _colours(pixels)
    assert pixels.shape[1] >= 1280 and len(colours) > 50, "the /ui screenshot looks blank"
    missing = {stage for stage, rgb in PALETTE.items() if rgb not in colours}
    assert not missing, f"stages not drawn in the /ui screenshot: {missing}"
    assert len(_colours(decode_png(Path(result["screenshots"]["waterfall"])))) > 20
    # The waterfall's rows: every client and server stage, and the network gap.
    assert {*CLIENT_STAGES, *SERVER_STAGES, "network + gateway"} <= set(result["waterfallLabels"])
    # One sentence above the waterfall names the cause, as the API judged it: the first
    # request of a fresh server is its cold path.
    verdict = httpx.get(f"{live.base_url}/ui/api/trace/{record.trace_id}", timeout=10).json()["verdict"]
    assert result["verdict"] == {"text": verdict["sentence"], "cause": verdict["cause"]}
    assert verdict["cause"] == "cold_path" and "first request since start" in verdict["sentence"], \
        (verdict, [(s.stage, s.duration_ns / 1e6, s.attrs) for s in record.stages])
    assert result["diagnosisCauses"] == ["cold_path"]
    # The header names the engine's CPU path, as /v1/models reports it.
    runtime = live.parts.aengine.engine.loaded.describe()
    assert result["engineInfo"] == (f"engine: cpu · {runtime['cpu_capability']} · "
                                    f"{runtime['dtype']} · weights "
                                    f"{'+'.join(runtime['weight_formats'])} · torch ops")
