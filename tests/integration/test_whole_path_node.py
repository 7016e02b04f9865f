"""Issue 32, item 5: the whole path through a Node backend traced with the real
`@opentelemetry/sdk-node` and its http instrumentation, with no ttftscope proxy or engine in
the data path.

Chromium loads the page with the probe from the Node backend
(tests/integration/node_traced_backend.mjs), which runs `retrieve` (with `embed` nested) and
`moderation` spans, calls a vLLM-shaped engine stand-in (tests/integration/vllm_standin_app.py,
exporting `llm_request` with the real Python SDK) and signs the beacon token with
frontend_probe/server.js. Both export OTLP/protobuf to `python -m tracer collect`, which
gets the beacon too and joins the three. The waterfall's backend segments must be those
spans' own durations (read from what the backend exported) within 1 ms, and all the
segments must sum to the client TTFT.
"""
from __future__ import annotations

import json
import secrets
import sys
from collections import defaultdict

import httpx
import pytest

from prom_support import free_port, wait_for
from topology_support import REPO, collector, metric_samples, open_page, process, require_browser_stack
from vllm_standin_app import MODEL, PREFILL_S, QUEUE_S

NODE_BACKEND = REPO / "tests" / "integration" / "node_traced_backend.mjs"


def read_spans(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    node = require_browser_stack()
    for package in ("sdk-node", "instrumentation-http", "exporter-trace-otlp-proto"):
        if not (REPO / "frontend_probe" / "node_modules" / "@opentelemetry" / package).is_dir():
            pytest.fail(f"npm @opentelemetry/{package} is missing: cd frontend_probe && npm ci")
    key = secrets.token_hex(16)
    logs = tmp_path_factory.mktemp("whole_path_node")
    web_port, engine_port = free_port(), free_port()
    web_origin = f"http://127.0.0.1:{web_port}"
    with collector(key, logs / "collector.log", "--join-wait-s", "3",
                   "--cors-origin", web_origin) as coll, \
            process([sys.executable, "-m", "uvicorn", "tests.integration.vllm_standin_app:app",
                     "--host", "127.0.0.1", "--port", str(engine_port), "--log-level", "warning"],
                    port=engine_port, health="/health", env={"TTFT_COLLECTOR_URL": coll},
                    log=logs / "engine.log") as engine, \
            process([node, str(NODE_BACKEND), json.dumps({
                "port": web_port, "engine": engine, "collector": coll, "beaconKey": key,
                "spans": str(logs / "backend_spans.jsonl")})],
                port=web_port, health="/health", log=logs / "backend.log",
                env={"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}) as web:
        yield node, key, coll, web, logs


def test_node_backend_spans_become_the_waterfall_segments(topology):
    node, key, coll, web, logs = topology
    url = (f"{web}/page/chat.html?api=/api&model={MODEL}&max_tokens=8"
           f"&collector={coll}/v1/probe")
    out = open_page(node, url)
    assert out["result"]["text"] == "Paris is the capital.", out
    [sent] = out["beacons"]
    beacon = json.loads(sent["body"])
    trace_id = beacon["trace_id"]
    # The token the page returned is the one server.js signed with the shared key, and no
    # in-band timing came (nothing of ttftscope's was in the path to write it).
    from tracer.web.probe.token import BeaconSigner
    assert beacon["token"] == BeaconSigner(key.encode()).token(trace_id)
    assert "server" not in beacon

    def joined():
        r = httpx.get(f"{coll}/ui/api/trace/{trace_id}", timeout=5)
        return r.json() if r.status_code == 200 else None
    try:
        record = wait_for(joined, 20, "the collector's whole path for the trace")
    except AssertionError as e:    # say what the collector counted
        counts = {k: v for k, v in metric_samples(coll).items() if k.startswith("llm_collector_")}
        raise AssertionError(f"{e}\ncollector: {counts}\n"
                             f"{(logs / 'collector.log').read_text()[-2000:]}") from None
    spans = [s for s in read_spans(logs / "backend_spans.jsonl") if s["trace_id"] == trace_id]
    by_name = {s["name"]: s for s in spans}

    # The instrumentation's server span is a child of the browser's, and the engine call is
    # its CLIENT span (kind 2 in @opentelemetry/api's SpanKind).
    [root] = [s for s in spans if s["parent_span_id"] == beacon["traceparent"].split("-")[2]]
    [call] = [s for s in spans if s["kind"] == 2 and s["parent_span_id"] == root["span_id"]]
    assert by_name["embed"]["parent_span_id"] == by_name["retrieve"]["span_id"]

    stages = record["stages"]
    names = [s["stage"] for s in stages]
    # No response-start span from Node: aligned on [fetch, stream end], or on the starts
    # when the server span outlasts the stream (then the uplink is its bound, zero, and no
    # `network` segment leads).
    shown = [(s["stage"], s["start_ms"], s["duration_ms"]) for s in stages]
    assert names[-1] == "first_token", shown
    if names[0] != "network":
        assert record["client"]["clock"]["anchor"] == "end" and names[0] == "POST", shown
    backend = [s for s in stages if s["attrs"]["part"] == "backend"]
    assert {s["attrs"]["service"] for s in backend} == {"node-chat-backend"}
    got = defaultdict(float)
    for s in backend:
        got[s["attrs"]["span_id"]] += s["duration_ms"]
        assert s["stage"] == next(x["name"] for x in spans if x["span_id"] == s["attrs"]["span_id"])

    def ms(span):
        return (int(span["end_ns"]) - int(span["start_ns"])) / 1e6
    # Sequential spans on the critical path: each segment is its span's own time, less the
    # child on the path inside it.
    retrieve, embed, moderation = by_name["retrieve"], by_name["embed"], by_name["moderation"]
    assert got[embed["span_id"]] == pytest.approx(ms(embed), abs=1.0)
    assert got[retrieve["span_id"]] == pytest.approx(ms(retrieve) - ms(embed), abs=1.0)
    assert got[moderation["span_id"]] == pytest.approx(ms(moderation), abs=1.0)
    # the root's own time: from its start to the engine call, less its children's
    own = (int(call["start_ns"]) - int(root["start_ns"])) / 1e6 - ms(retrieve) - ms(moderation)
    assert got[root["span_id"]] == pytest.approx(own, abs=1.0)
    order = [s["stage"] for s in backend]
    assert order.index("embed") < order.index("moderation")
    assert names.index("moderation") < names.index("backend_to_engine") < names.index("queue") \
        < names.index("prefill") < names.index("first_token")

    # The engine's stages are the stand-in's vLLM attributes.
    by_stage = {s["stage"]: s["duration_ms"] for s in stages}
    assert by_stage["queue"] == pytest.approx(QUEUE_S * 1e3, abs=0.01)
    assert by_stage["prefill"] == pytest.approx(PREFILL_S * 1e3, abs=0.01)

    # Contiguous, and summing to the client's TTFT.
    for a, b in zip(stages, stages[1:]):
        assert b["start_ms"] == pytest.approx(a["end_ms"], abs=1e-6)
    client_ttft = record["client"]["client_ttft_ms"]
    assert client_ttft == pytest.approx(beacon["t"]["first_token"] - beacon["t"]["start"], abs=0.01)
    assert sum(s["duration_ms"] for s in stages) == pytest.approx(client_ttft, abs=0.01)

    counts = metric_samples(coll)
    assert counts.get('llm_collector_traces_total{outcome="complete"}', 0) >= 1, counts
