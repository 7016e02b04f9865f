"""The waterfall UI's JSON API and static files, on synthetic records."""
from __future__ import annotations

import re
import statistics

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tracer.record.clock import Clock
from tracer.web.probe.ingest import ProbeIngestor
from tracer.web.probe.schema import parse_beacon
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import SERVER_STAGES
from tracer.sinks.store import TraceStore
from tracer.web.auth import is_open_path
from tracer.web.ui_api import UI_DIR, make_ui_router, static_files_router

MS = 1_000_000
WALL_NS = 1_700_000_000_000_000_000
PERF_NS = 10_000_000_000


def record(i: int, stage_ms: dict[str, float], start_ms: float = 0.0, unattributed_ms: float = 0.0,
           **kw) -> RequestRecord:
    start_ns = PERF_NS + round(start_ms * MS)
    stages, t_ns = [], start_ns
    for stage in SERVER_STAGES:
        if stage in stage_ms:
            end_ns = t_ns + round(stage_ms[stage] * MS)
            stages.append(StageSpan(stage, t_ns, end_ns, {"n": i, "flops": float("inf")}))
            t_ns = end_ns
        else:
            t_ns += round(unattributed_ms * MS)
    return RequestRecord(
        f"chatcmpl-{i}", f"{i + 1:032x}", f"{i + 1:016x}", "smollm2", "chat", start_ns,
        t_ns + 100 * MS, stages=tuple(stages), ttft_ns=t_ns - start_ns,
        unattributed_ns=round(unattributed_ms * MS),
        events=(("response_start", start_ns + 2 * MS, {}),
                ("prefill_chunk", start_ns + 20 * MS, {"num_tokens": 64})), **kw)


def even(total_ms: float, prefill_share: float) -> dict[str, float]:
    """Stage durations: prefill gets `prefill_share` of `total_ms`, the rest split evenly."""
    rest = total_ms * (1 - prefill_share) / 8
    return {s: (total_ms * prefill_share if s == "prefill" else rest) for s in SERVER_STAGES}


@pytest.fixture
def app_and_store():
    store = TraceStore(capacity=50)
    app = FastAPI()
    app.include_router(make_ui_router(store=store, clock=Clock(wall_ns=WALL_NS, perf_ns=PERF_NS)))
    return TestClient(app), store


def test_requests_lists_newest_first_with_the_table_fields(app_and_store):
    client, store = app_and_store
    for i in range(5):
        store.put(record(i, even(40.0 + i, 0.5), start_ms=100.0 * i, num_prompt_tokens=10 + i,
                         num_cached_tokens=i, num_output_tokens=3))
    rows = client.get("/ui/api/requests", params={"limit": 3}).json()["requests"]
    assert [r["request_id"] for r in rows] == ["chatcmpl-4", "chatcmpl-3", "chatcmpl-2"]
    top = rows[0]
    assert top["trace_id"] == f"{5:032x}" and top["model"] == "smollm2"
    assert (top["num_prompt_tokens"], top["num_cached_tokens"], top["num_output_tokens"]) == (14, 4, 3)
    assert top["server_ttft_ms"] == pytest.approx(44.0) and top["client_ttft_ms"] is None
    assert top["time_unix_ms"] == (WALL_NS + 400 * MS) // MS
    assert top["finish_reason"] == "stop"
    assert client.get("/ui/api/requests", params={"limit": 0}).status_code == 400   # OpenAI shape


def test_trace_puts_server_and_client_stages_on_one_axis(app_and_store):
    client, store = app_and_store
    store.put(record(0, even(53.0, 0.6)))
    trace_id = f"{1:032x}"
    beacon = parse_beacon((
        '{"v":1,"trace_id":"%s","outcome":"ok","status":200,'
        '"t":{"start":0,"headers":22,"first_byte":22.5,"first_token":70,"first_paint":80,"end":150}}'
        % trace_id).encode())
    assert ProbeIngestor(store=store).ingest(beacon) == "accepted"
    view = client.get(f"/ui/api/trace/{trace_id}").json()
    stages = view["stages"]
    assert [s["stage"] for s in stages] == list(SERVER_STAGES)
    assert stages[0]["start_ms"] == 0.0
    assert stages[-1]["end_ms"] == pytest.approx(53.0) == pytest.approx(view["server_ttft_ms"])
    for a, b in zip(stages, stages[1:]):
        assert a["end_ms"] == b["start_ms"]
    assert stages[0]["attrs"] == {"n": 0, "flops": None}   # non-finite floats are not JSON
    assert {e["name"]: e["t_ms"] for e in view["events"]} == {"response_start": 2.0,
                                                             "prefill_chunk": 20.0}
    c = view["client"]
    # θ: server mid 1 ms, client mid 11 ms → client start at −10 ms on the server axis.
    assert [(s["stage"], s["start_ms"], s["end_ms"]) for s in c["stages"]] == [
        ("client.request", -10.0, 12.0), ("client.first_byte", 12.0, 12.5),
        ("client.first_token", 12.5, 60.0), ("client.first_paint", 60.0, 70.0)]
    assert c["gap"]["uplink_ms"] == pytest.approx(10.0)
    assert c["gap"]["downlink_ms"] == pytest.approx(60.0 - 53.0)
    assert c["gap"]["total_ms"] == pytest.approx(c["network_overhead_ms"]) == pytest.approx(17.0)
    assert c["clock"]["uncertainty_ms"] == pytest.approx(10.0)


def test_trace_unknown_or_malformed_id_is_404_in_openai_shape(app_and_store):
    client, store = app_and_store
    store.put(record(0xabc - 1, even(10.0, 0.5)))
    assert client.get(f"/ui/api/trace/{0xabc:032x}").status_code == 200
    for trace_id in ("f" * 32, "not-a-trace-id", f"{0xabc:032x}".upper()):
        r = client.get(f"/ui/api/trace/{trace_id}")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "trace_not_found"


def test_attribution_is_the_median_share_over_the_last_n(app_and_store):
    client, store = app_and_store
    shares = [0.9, 0.5, 0.6, 0.7, 0.2]
    for i, share in enumerate(shares):
        store.put(record(i, even(100.0 + 10 * i, share)))
    store.put(RequestRecord("chatcmpl-x", "e" * 32, "e" * 16, "smollm2", "chat", 0, 1,
                            finish_reason="abort"))   # no token: not in the medians
    att = client.get("/ui/api/attribution", params={"last": 4}).json()
    by_stage = {s["stage"]: s for s in att["stages"]}
    assert att["num_requests"] == 3
    assert by_stage["prefill"]["median_share"] == pytest.approx(statistics.median(shares[2:]))
    assert by_stage["prefill"]["median_ms"] == pytest.approx(0.6 * 120)
    assert by_stage["queue"]["median_share"] == pytest.approx((1 - 0.6) / 8)
    assert by_stage["unattributed"]["median_share"] == 0.0
    assert att["median_ttft_ms"] == pytest.approx(130.0)
    assert att["network"] is None
    everything = client.get("/ui/api/attribution", params={"last": 100}).json()
    assert everything["num_requests"] == 5
    assert {s["stage"]: s for s in everything["stages"]}["prefill"]["median_share"] == pytest.approx(0.6)


def test_attribution_counts_unattributed_time(app_and_store):
    client, store = app_and_store
    stage_ms = {s: 1.0 for s in SERVER_STAGES if s != "queue"}
    store.put(record(0, stage_ms, unattributed_ms=2.0))
    by_stage = {s["stage"]: s for s in client.get("/ui/api/attribution").json()["stages"]}
    assert by_stage["unattributed"]["median_share"] == pytest.approx(2.0 / 10.0)
    assert by_stage["queue"]["median_share"] == 0.0


def test_static_page_and_assets_are_served(app_and_store):
    client, _ = app_and_store
    r = client.get("/ui", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.headers["content-type"].startswith("text/html")
    assert 'src="ui.js"' in page.text and 'href="ui.css"' in page.text
    assert client.get("/ui/ui.js").headers["content-type"].startswith("text/javascript")
    assert 'src="timeline.js"' in page.text
    assert client.get("/ui/timeline.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/ui.css").headers["content-type"].startswith("text/css")
    assert client.get("/ui/../tracer/sinks/store.py").status_code == 404
    # every script the page loads is served, and open with --api-key (the page asks for the
    # key only once its scripts run), and every script in the folder is one the page loads
    scripts = re.findall(r'<script src="([^"]+)"></script>', page.text)
    assert scripts[-2:] == ["ui.js", "timeline.js"]
    assert sorted(scripts) == sorted(p.name for p in UI_DIR.glob("*.js"))
    for name in scripts:
        assert client.get(f"/ui/{name}").headers["content-type"].startswith("text/javascript")
        assert is_open_path(f"/ui/{name}"), name


def test_page_never_writes_data_as_html():
    for script in UI_DIR.glob("*.js"):
        source = script.read_text()
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write",
                             source), script
        # no CDN, no beacons out
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", source), script


def test_static_files_router_serves_only_its_files(tmp_path):
    (tmp_path / "page.html").write_text("<p>hi</p>")
    app = FastAPI()
    app.include_router(static_files_router({"/p": tmp_path / "page.html",
                                            "/gone": tmp_path / "missing.js"}))
    client = TestClient(app)
    assert client.get("/p").text == "<p>hi</p>"
    missing = client.get("/gone")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert client.get("/page.html").status_code == 404
