"""Issue 25 in real headless Chromium: the probe where chat frontends live.

- A Node backend built with the real `ai` and `@ai-sdk/openai` (tests/integration/
  chat_backend.mjs, versions pinned in frontend_probe/package.json) in front of the engine
  (real SmolLM2), with frontend_probe/server.js; the page's client is the AI SDK's own browser
  code (its AbstractChat and transports, bundled by the pinned esbuild). The UI message
  stream's beacon reaches a separate `python -m tracer collect`, which measures client TTFT and
  network + gateway time from it alone; the text stream's beacon is joined by the engine's own
  /v1/probe (a plain-text body has no place for the in-band timing a separate collector needs).
- The real @anthropic-ai/sdk and openai (Responses API) browser clients, and plain fetch for
  Ollama's NDJSON and Gemini's SSE, against fake upstreams replaying the recorded streams of
  tests/fixtures/sse/formats/: the probe's first token is within 2 ms of the page's own clock
  (once the client's code is warm: the page reads the stream three times).

Each fails with its format's rule removed from frontend_probe/formats.js (the beacon's
`format` and first token are asserted).
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from instrumented_engine.server.app import ServerSettings
from prom_support import free_port, wait_for
from tracer.web.observability import ObservabilitySettings
from topology_support import (backend, collector, decode_timing_token, metric_samples, open_page,
                              process, require_browser_stack)

REPO = Path(__file__).resolve().parents[2]
BACKEND = Path(__file__).with_name("chat_backend.mjs")
FIXTURES = REPO / "tests" / "fixtures" / "sse" / "formats"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
GAP_MS = 60            # chat_backend.mjs: between two reads of a replayed stream
CLIENT_TTFT = "llm_client_time_to_first_token_seconds"
NETWORK = "llm_client_network_overhead_seconds"
TP_TRACE = slice(3, 35)


def _node_modules() -> None:
    for package in ("ai", "@ai-sdk/openai", "@anthropic-ai/sdk", "esbuild"):
        if not (REPO / "frontend_probe" / "node_modules" / package).is_dir():
            pytest.fail(f"npm {package} is missing: cd frontend_probe && npm ci")


def chat_backend(node: str, log: Path, engine_url: str = "http://127.0.0.1:9", model: str = "m"):
    port = free_port()
    opts = {"port": port, "engine": engine_url, "model": model, "gapMs": GAP_MS, "maxTokens": 8}
    return process([node, str(BACKEND), json.dumps(opts)], port=port, health="/health", log=log)


def read_cuts(name: str) -> list[int]:
    """Byte offsets of the replayed reads, the way chat_backend.mjs cuts the fixture."""
    cuts_file = FIXTURES / (name.rsplit(".", 1)[0] + ".chunks.json")
    return json.loads(cuts_file.read_text()) if cuts_file.exists() else []


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    node = require_browser_stack()
    _node_modules()
    with chat_backend(node, tmp_path_factory.mktemp("formats") / "backend.log") as web:
        yield node, web


@pytest.mark.parametrize("client, fixture, expected_text", [
    ("anthropic", "anthropic.sse", "Paris — élan 🙂."),
    ("responses", "openai_responses.sse", "Paris it is."),
    ("ollama", "ollama_chat.ndjson", "Paris — élan."),
    ("gemini", "gemini.sse", "Paris is the capital."),
])
def test_provider_clients_in_chromium_first_token_on_the_page_s_clock(fakes, client, fixture,
                                                                    expected_text):
    node, web = fakes
    want = EXPECTED[fixture]
    out = open_page(node, f"{web}/page/sdk_stream.html?client={client}&fixture={fixture}")
    runs = out["result"]["runs"]
    assert [r["text"] for r in runs] == [expected_text] * 3
    beacons = [json.loads(b["body"]) for b in out["beacons"]]
    assert len(beacons) == 3
    gaps = []
    for run, beacon in zip(runs, beacons):
        assert beacon["outcome"] == "ok" and beacon["status"] == 200
        assert beacon["probe_errors"] == 0
        assert beacon["format"] == want["format"]
        assert beacon["chunks"] == want["content_events"]
        first, own = beacon["t"]["first_token"], run["own_first_token"]
        assert first is not None and own is not None
        # the probe reads each byte before the page's client does, never after it
        assert own - first >= -0.5, (first, own)
        # it is the read that completed the first content event, not an earlier one: the
        # replay leaves GAP_MS between reads, so a token taken one read early is GAP_MS off
        assert own - first < GAP_MS / 2, (first, own)
        assert read_cuts(fixture) and first >= beacon["t"]["first_byte"] + GAP_MS * 0.9
        if want["first_reasoning"] is None:
            assert "first_reasoning" not in beacon["t"]
        else:
            assert beacon["t"]["first_reasoning"] <= first
        _assert_tool_calls(beacon, want)
        if want["first_tool_call"] is not None:
            assert beacon["t"]["first_tool_call"] <= first
        gaps.append(own - first)
    # the first run warms the page's client up; once warm, the probe's first token is the
    # page's own first text within 2 ms (a busy machine may delay one run's JavaScript)
    assert min(gaps[1:]) <= 2.0, gaps


def _assert_tool_calls(beacon: dict, want: dict) -> None:
    """t.first_tool_call and tool_calls as expected.json says: present exactly when the
    stream names a tool call; each call's name, and a ready time exactly when its arguments
    completed, never before its start, all within the stream; never its arguments."""
    t = beacon["t"]
    if want["first_tool_call"] is None:
        assert "first_tool_call" not in t and "tool_calls" not in beacon
        return
    assert t["first_byte"] <= t["first_tool_call"] <= t["end"]
    calls = beacon["tool_calls"]
    assert [(c["name"], c["ready"] is None) for c in calls] == [
        (name, ready is None) for name, _, ready in want["tool_calls"]]
    assert calls[0]["start"] == t["first_tool_call"]
    for call in calls:
        assert set(call) == {"name", "start", "ready"}
        assert call["ready"] is None or call["start"] <= call["ready"] <= t["end"]


@pytest.mark.parametrize("client, fixture", [
    ("responses", "openai_responses_function_call.sse"),
    ("ollama", "ollama_tool_calls.ndjson"),
])
def test_provider_clients_in_chromium_a_tool_call_answer_has_its_first_output(fakes, client,
                                                                              fixture):
    """Issue 37: an answer that is only a tool call has no first text, but the beacon has its
    first output (t.first_tool_call) and the call's name and ready time."""
    node, web = fakes
    want = EXPECTED[fixture]
    out = open_page(node, f"{web}/page/sdk_stream.html?client={client}&fixture={fixture}")
    assert [r["text"] for r in out["result"]["runs"]] == [""] * 3
    beacons = [json.loads(b["body"]) for b in out["beacons"]]
    assert len(beacons) == 3
    for beacon in beacons:
        assert beacon["outcome"] == "ok" and beacon["probe_errors"] == 0
        assert beacon["format"] == want["format"] and beacon["chunks"] == 0
        assert beacon["t"]["first_token"] is None
        _assert_tool_calls(beacon, want)
        assert "Paris" not in json.dumps(beacon)     # the arguments stay on the page


# --- the AI SDK backend in front of the real engine ----------------------------------------

@pytest.fixture(scope="module")
def ai_topology(server_factory, tmp_path_factory):
    node = require_browser_stack()
    _node_modules()
    key = secrets.token_hex(16)
    engine = server_factory(ServerSettings(observability=ObservabilitySettings(beacon_key=key)))
    logs = tmp_path_factory.mktemp("ai_sdk")
    with chat_backend(node, logs / "backend.log", engine.base_url, engine.model) as web, \
            collector(key, logs / "collector.log", "--served-model-name", engine.model,
                      "--cors-origin", web) as coll:
        yield node, engine, web, coll


def _collector_observed(coll: str, before: dict, beacon: dict, timing: dict) -> None:
    """The separate collector turned `beacon` alone into client TTFT and network time."""
    def observed():
        now = metric_samples(coll)
        return now if now.get(f"{NETWORK}_count", 0) > before.get(f"{NETWORK}_count", 0) else None
    after = wait_for(observed, 15, "the collector's client metrics")
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in
             (f"{CLIENT_TTFT}_count", f"{CLIENT_TTFT}_sum", f"{NETWORK}_count", f"{NETWORK}_sum")}
    assert delta[f"{CLIENT_TTFT}_count"] == 1 and delta[f"{NETWORK}_count"] == 1, delta
    client_ttft_ms = beacon["t"]["first_token"]
    assert delta[f"{CLIENT_TTFT}_sum"] == pytest.approx(client_ttft_ms / 1e3, abs=1e-6)
    assert delta[f"{NETWORK}_sum"] == pytest.approx((client_ttft_ms - timing["ttft_ms"]) / 1e3,
                                                    abs=1e-6)


def test_ai_sdk_ui_message_stream_beacon_is_measured_by_a_separate_collector(ai_topology):
    node, engine, web, coll = ai_topology
    before = metric_samples(coll)
    out = open_page(node, f"{web}/page/ai_chat.html?transport=ui&collector={coll}/v1/probe"
                          "&prompt=What+is+the+capital+of+France%3F")
    result = out["result"]
    assert result["text"].strip() and result["role"] == "assistant"
    # the timing part reached the AI SDK's onData and, transient, stayed out of the message
    assert "data-ttft-timing" in result["data"] and "data-ttft-timing" not in result["parts"]
    [sent] = out["beacons"]
    assert sent["url"] == f"{coll}/v1/probe"
    beacon = json.loads(sent["body"])
    assert beacon["format"] == "ai-sdk-ui" and beacon["outcome"] == "ok"
    assert beacon["chunks"] >= 1 and beacon["probe_errors"] == 0

    # the engine served the browser's own trace (server.js forwarded its traceparent)...
    trace_id = beacon["trace_id"]
    record = wait_for(lambda: engine.parts.obs.store.get(trace_id), 10, "the engine's record")
    assert beacon["traceparent"][TP_TRACE] == trace_id == record.trace_id
    # ...and its signed timing came through the AI SDK's stream as the data part
    timing = decode_timing_token(beacon["server"])
    assert timing["trace_id"] == trace_id and timing["source"] == "engine"
    assert timing["span_id"] == record.span_id

    _collector_observed(coll, before, beacon, timing)
    client_ttft_ms = beacon["t"]["first_token"]
    # the browser saw its first token after the engine sent it (AI SDK and backend in between)
    assert client_ttft_ms >= timing["ttft_ms"] - record.stage_ns("send") / 1e6


def test_ai_sdk_text_stream_beacon_is_joined_by_the_engine(ai_topology):
    node, engine, web, _ = ai_topology
    out = open_page(node, f"{web}/page/ai_chat.html?transport=text"
                          f"&collector={engine.base_url}/v1/probe&prompt=Name+a+colour.")
    assert out["result"]["text"].strip()
    [sent] = out["beacons"]
    beacon = json.loads(sent["body"])
    assert beacon["format"] == "text" and beacon["outcome"] == "ok"
    # no in-band line in a text body; Server-Timing (copied by server.js) gave trace and token
    assert "server" not in beacon and len(beacon["token"]) == 64
    trace_id = beacon["trace_id"]
    assert beacon["traceparent"][TP_TRACE] == trace_id
    record = wait_for(lambda: (r := engine.parts.obs.store.get(trace_id)) is not None
                      and r.client is not None and r, 15, "the engine's join of the beacon")
    assert record.client["client_ttft_ms"] == beacon["t"]["first_token"]
    assert record.client["network_overhead_ms"] == pytest.approx(
        beacon["t"]["first_token"] - record.ttft_ns / 1e6, abs=1e-6)
    assert record.client["format"] == "text"


def test_readme_fastapi_backend_that_re_streams_keeps_the_join(ai_topology, tmp_path):
    """docs/backends.md's Python backend (tests/integration/backend_app.py, POST /api/chat) writes
    events of its own and the engine's token; the page's isContent hook reads its format."""
    node, engine, _, coll = ai_topology
    with backend(engine.base_url, tmp_path / "fastapi.log") as web:
        before = metric_samples(coll)
        out = open_page(node, f"{web}/page/house.html?model={engine.model}&max_tokens=8"
                              f"&collector={coll}/v1/probe&prompt=What+is+the+capital+of+France%3F")
    assert out["result"]["text"].strip()
    [sent] = out["beacons"]
    beacon = json.loads(sent["body"])
    assert beacon["format"] == "custom" and beacon["outcome"] == "ok" and beacon["chunks"] >= 1
    trace_id = beacon["trace_id"]
    record = wait_for(lambda: engine.parts.obs.store.get(trace_id), 10, "the engine's record")
    assert beacon["traceparent"][TP_TRACE] == trace_id == record.trace_id
    timing = decode_timing_token(beacon["server"])
    assert timing["trace_id"] == trace_id and timing["span_id"] == record.span_id
    _collector_observed(coll, before, beacon, timing)
