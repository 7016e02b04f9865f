"""Issue 36, item 4: the /ui timeline in real Chromium, its numbers checked against the API's
(docs/reference.md, "Timeline and neighbours").

The page (tracer/web/static/ui/timeline.js) writes what it drew on `#timeline` as data-
attributes: the rows and steps it drew, the row height, the selected row's index and its
phases, the draw's own time. tests/integration/timeline_driver.mjs opens the page, reads them
with the neighbours table, the verdict and the tooltip, and screenshots the canvas; here they
are compared with /ui/api/timeline and /ui/api/trace/<id> for the same window.

- Our engine with the packaged SmolLM2 and `max_num_seqs=2` (`--max-num-seqs 2`), served on
  loopback by the `server_factory` fixture as test_browser_e2e.py does: a ~2,000-token prompt,
  a short one 150 ms later and three more; the timeline around the short one, then a click on
  the long one's row.
- Readability at 500 requests: `python -m tracer proxy` in front of the fake upstream, 500
  short requests, the timeline of a window covering them, chosen in the page's form. Every
  row must be drawn at least 1 px high and show in the screenshot.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from prom_support import free_port
from test_browser_e2e import decode_png
from topology_support import REPO, process, require_browser_stack
from tracer.record.traceparent import parse_server_timing, parse_traceparent
from tracer.testing.fake_upstream import FakeUpstream

DRIVER = Path(__file__).with_name("timeline_driver.mjs")
# timeline.js TL_BASE and TL_PHASES: the colours a request's row is drawn in, whole pixels.
ROW_COLOURS = {0xc9ccd3, 0xa47fd1, 0xe06c5a, 0x3f7fd9, 0x2aa198, 0x8fb3e0}
PHASES = ("preprocess", "queue", "prefill", "first_token", "decode")
NUM_MANY = 500
DRAW_BUDGET_MS = 2000      # generous: the page measured a few ms on a loaded 2-core machine
MODEL = "fake-model"


def _drive(node: str, opts: dict) -> dict:
    run = subprocess.run([node, str(DRIVER), json.dumps(opts)], capture_output=True, text=True,
                         timeout=opts["timeoutMs"] / 1000 + 60, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["pageErrors"] == [], out["pageErrors"]
    return out


def _chat(base_url: str, model: str, content: str, max_tokens: int = 8) -> str:
    """One streamed chat turn; its trace id, from the answer's Server-Timing."""
    with httpx.Client(base_url=base_url, timeout=300) as client:
        r = client.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": content}],
            "stream": True, "max_tokens": max_tokens, "temperature": 0})
        assert r.status_code == 200, r.text
    return parse_traceparent(parse_server_timing(r.headers["server-timing"])).trace_id


def _rgb(pixels: np.ndarray) -> np.ndarray:
    rgb = pixels[..., :3].astype(np.uint32)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


def _check_canvas_png(shots: dict, drawn: dict) -> np.ndarray:
    """The canvas's screenshot decodes, has the canvas's size (to the pixel its clip may round
    out to) and is not one colour; the packed RGB pixels the canvas holds (its toDataURL)."""
    size = (int(drawn["canvasHeight"]), int(drawn["canvasWidth"]))
    shown = decode_png(Path(shots["canvas"]))
    assert all(0 <= a - b <= 1 for a, b in zip(shown.shape[:2], size)), (shown.shape, size)
    assert len(np.unique(_rgb(shown))) > 8, "the timeline screenshot is (nearly) one colour"
    pixels = decode_png(Path(shots["pixels"]))
    assert pixels.shape[:2] == size, pixels.shape     # the page's device pixel ratio is 1
    return _rgb(pixels)


def _check_page_against_api(base_url: str, drawn: dict) -> dict:
    """The rows, steps and window the page drew are the API's for the same query."""
    api = httpx.get(f"{base_url}/ui/api/timeline?{drawn['query']}", timeout=30).json()
    assert int(drawn["rows"]) == api["num_requests"] == len(api["requests"]), \
        (drawn, api["num_requests"])
    assert int(drawn["steps"]) == api["num_steps"] == len(api["steps"]), (drawn, api["num_steps"])
    assert (float(drawn["fromUnixMs"]), float(drawn["toUnixMs"])) == (
        api["from_unix_ms"], api["to_unix_ms"])
    return api


def test_timeline_around_a_short_request_behind_a_long_one(server_factory, tmp_path):
    node = require_browser_stack()
    live = server_factory(max_num_seqs=2)
    words = " ".join(f"item{i}" for i in range(500))             # ~2,000 tokens
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        long = pool.submit(_chat, live.base_url, live.model, f"Summarise this list: {words}")
        time.sleep(0.15)
        short = pool.submit(_chat, live.base_url, live.model, "Say hi.")
        others = [pool.submit(_chat, live.base_url, live.model, f"Count to {i + 3}.")
                  for i in range(3)]
        long_id, short_id = long.result(), short.result()
        other_ids = [f.result() for f in others]
    live.wait_idle()
    view = httpx.get(f"{live.base_url}/ui/api/trace/{short_id}", timeout=30).json()
    assert view["num_prompt_tokens"] < 100 and view["verdict"] is not None, view
    items = view["neighbours"]["items"]
    assert long_id in {i["trace_id"] for i in items}, items   # it overlapped the short's wait

    window = httpx.get(f"{live.base_url}/ui/api/timeline?trace_id={short_id}&pad_ms=2000",
                       timeout=30).json()
    ids = [r["trace_id"] for r in window["requests"]]
    # the driver reads the page, then clicks the long request's row
    out = _drive(node, {"url": f"{live.base_url}/ui/#trace={short_id}", "outDir": str(tmp_path),
                        "traceId": short_id, "clickRow": ids.index(long_id), "timeoutMs": 90_000})
    drawn = out["timeline"]
    assert drawn["query"] == f"trace_id={short_id}&pad_ms=2000", drawn
    api = _check_page_against_api(live.base_url, drawn)
    assert api["step_log_size"] is not None and api["num_steps"] > 0, api["step_log_size"]
    assert [r["trace_id"] for r in api["requests"]] == ids
    assert {long_id, short_id, *other_ids} <= set(ids)
    # the selected row: the short request's, its phases as the API has them
    selected = api["requests"][ids.index(short_id)]
    assert int(drawn["selectedIndex"]) == ids.index(short_id), drawn
    phases = json.loads(drawn["selectedPhases"])
    assert [p["phase"] for p in phases] == [p["phase"] for p in selected["phases"]]
    for page_phase, api_phase in zip(phases, selected["phases"]):
        assert page_phase["phase"] in PHASES
        assert page_phase["ms"] == pytest.approx(api_phase["end_ms"] - api_phase["start_ms"],
                                                 abs=0.1)
    # the neighbours table lists /ui/api/trace/<id>'s, in its order
    assert out["neighboursFor"] == short_id
    assert [n["traceId"] for n in out["neighbours"]] == [i["trace_id"] for i in items]
    assert out["neighbours"][0]["traceId"] == items[0]["trace_id"]
    verdict = view["verdict"]
    assert out["verdict"] == {"text": verdict["sentence"], "cause": verdict["cause"]}
    # the tooltip over the selected row: its trace id, phases and tokens
    tip = out["tooltip"]
    assert tip[0] == f"trace {short_id}", tip
    assert [line.split(":")[0] for line in tip[2:-1]] == [p["phase"] for p in selected["phases"]]
    assert tip[-1].startswith(f"tokens: {selected['num_prompt_tokens']} prompt, "
                              f"{selected['num_cached_tokens']} cached"), tip

    packed = _check_canvas_png(out["screenshots"], drawn)
    assert {0x3f7fd9, 0x8fb3e0} <= set(np.unique(packed).tolist()), "no prefill or decode drawn"
    assert len(np.unique(_rgb(decode_png(Path(out["screenshots"]["panel"]))))) > 20
    print(f"timeline of {api['num_requests']} requests and {api['num_steps']} steps drawn in "
          f"{drawn['drawMs']} ms")

    # the click on the long request's row opened its waterfall and centred the timeline on it
    clicked = out["clicked"]
    assert clicked["traceId"] == long_id
    assert clicked["waterfallId"].startswith(long_id), clicked
    assert clicked["timeline"]["query"] == f"trace_id={long_id}&pad_ms=2000", clicked


async def _send_many(base_url: str, n: int, concurrency: int = 16) -> None:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        async def one(i: int) -> None:
            async with gate:
                r = await client.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}],
                    "stream": True, "max_tokens": 4})
                assert r.status_code == 200, r.text
        await asyncio.gather(*(one(i) for i in range(n)))


def test_five_hundred_requests_each_get_a_row(tmp_path):
    node = require_browser_stack()
    upstream = FakeUpstream(chunks=3, gap_ms=0).start()
    port = free_port()
    try:
        with process([sys.executable, "-m", "tracer", "proxy", "--upstream", upstream.base_url,
                      "--listen", f"127.0.0.1:{port}", "--served-model-name", MODEL],
                     port=port, health="/health", log=tmp_path / "proxy.log",
                     env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) as proxy_url:
            asyncio.run(_send_many(proxy_url, NUM_MANY))
            rows = httpx.get(f"{proxy_url}/ui/api/requests?limit=1000",
                             timeout=30).json()["requests"]
            assert len(rows) == NUM_MANY
            starts = [r["time_unix_ms"] for r in rows]
            window = {"fromUnixMs": min(starts) - 100, "toUnixMs": max(starts) + 1000}
            out = _drive(node, {"url": f"{proxy_url}/ui/", "outDir": str(tmp_path),
                                "range": window, "timeoutMs": 90_000})
            drawn = out["timeline"]
            api = _check_page_against_api(proxy_url, drawn)
    finally:
        upstream.stop()
    assert int(drawn["rows"]) == api["num_requests"] == NUM_MANY, drawn
    assert api["step_log_size"] is None and int(drawn["steps"]) == 0   # a proxy has no steps
    row_h, top = int(drawn["rowHeight"]), int(drawn["rowsTop"])
    assert row_h >= 1, drawn
    # every row shows: its pixel line holds a bar's colour, exactly (bars sit on whole pixels)
    packed = _check_canvas_png(out["screenshots"], drawn)
    bars = np.isin(packed, np.array(sorted(ROW_COLOURS), np.uint32))
    missing = [i for i in range(NUM_MANY) if not bars[top + i * row_h: top + (i + 1) * row_h].any()]
    assert not missing, f"rows not visible in the screenshot: {missing[:20]}"
    draw_ms = float(drawn["drawMs"])
    print(f"{NUM_MANY} rows drawn {row_h} px high in {draw_ms:.1f} ms (page's performance.now())")
    assert 0 <= draw_ms < DRAW_BUDGET_MS, drawn
