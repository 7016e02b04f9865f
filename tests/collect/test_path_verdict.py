"""The whole path's TTFT verdict (tracer/collect/path_verdict.py): a backend span slower than
its normal is the cause, named, with the change; the engine's causes still come from its
segments alone; a name outside the closed set never gets a normal. Driven through the
collector's app, as a backend and vLLM export and the probe beacons."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from test_whole_path_join import App, _segments
from tracer.record.baselines import MIN_SAMPLES
from tracer.record.causes import BACKEND
from tracer.collect.app import CollectorSettings, create_collector_app
from tracer.web.observability import ObservabilitySettings
from whole_path_support import CLIENT, KEY, SERVER, VLLM, beacon, now_base_ns, span

WARM_TRACES = 12    # a name is a label after 3 traces; its series says something after 8


def _trace(i: int, *, select_ms: float = 25.0, queue_s: float = 0.02,
           extra: tuple[str, float] | None = None) -> tuple[str, list[dict], dict]:
    """POST /chat: auth [1, 5]; retrieve [5, 15 + select] ⊃ `SELECT docs`; optionally one
    more step of `extra` (name, ms) before the engine call; vLLM queues `queue_s`."""
    trace_id = f"{i + 1:032x}"
    base = now_base_ns()
    d = select_ms - 25.0 + (extra[1] if extra else 0.0)
    s = lambda *a, **k: span(trace_id, *a, base_ns=base, **k)
    ttft_s = 0.042 + queue_s
    spans = [s("1" * 16, "b" * 16, "POST /chat", 0, 300 + d + queue_s * 1e3, kind=SERVER),
             s("2" * 16, "1" * 16, "auth", 1, 5),
             s("3" * 16, "1" * 16, "retrieve", 5, 15 + select_ms),
             s("4" * 16, "3" * 16, "SELECT docs", 10, 10 + select_ms)]
    if extra:
        spans.append(s("5" * 16, "1" * 16, extra[0], 15 + select_ms, 15 + select_ms + extra[1]))
    call = 41 + d
    spans += [s("6" * 16, "1" * 16, "POST /chat http send", call, call + 0.01,
                attrs={"asgi.event.type": "http.response.start"}),
              s("7" * 16, "1" * 16, "POST", call, call + 250 + queue_s * 1e3, kind=CLIENT),
              s("8" * 16, "7" * 16, "llm_request", call + 2, call + 240 + queue_s * 1e3,
                kind=SERVER, service="vllm",
                attrs={**VLLM, "gen_ai.latency.time_to_first_token": ttft_s,
                       "gen_ai.latency.time_in_queue": queue_s})]
    first_token = call + 2 + ttft_s * 1e3 + 3
    return trace_id, spans, beacon(trace_id, headers=call + 2, first_token=first_token,
                                   end=first_token + 10)


def _verdict(app: App, i: int, **kwargs) -> dict:
    trace_id, spans, body = _trace(i, **kwargs)
    app.spans(spans)
    assert app.beacon(body) == 202
    view = app.trace(trace_id)
    assert view is not None and view["verdict"] is not None, view
    return view


@pytest.fixture()
def warm() -> App:
    app = App()
    for i in range(WARM_TRACES):
        view = _verdict(app, i, select_ms=24.0 + i % 3)
        # The first is cold; then not judged until the baselines hold 8 traces; then healthy.
        expected = "cold_path" if i == 0 else "unjudged" if i < MIN_SAMPLES else "healthy"
        assert view["verdict"]["cause"] == expected, (i, view["verdict"], _segments(view))
    return app


def test_a_slow_database_query_is_the_cause_named_by_its_span(warm):
    view = _verdict(warm, WARM_TRACES, select_ms=425.0)
    verdict = view["verdict"]
    assert verdict["cause"] == "backend", verdict
    evidence = verdict["evidence"]
    assert set(evidence) == set(BACKEND.evidence)
    assert evidence["segment"] == "SELECT docs" and evidence["service"] == "api"
    assert evidence["span_id"] == "4" * 16
    assert evidence["segment_ms"] == pytest.approx(425.0, abs=0.5)
    assert evidence["normal_segment_ms"] == pytest.approx(25.0, abs=1.0)
    assert verdict["excess_ms"] == pytest.approx(400.0, abs=1.5)
    # One change, whichever engine serves: the same for all, said once.
    assert verdict["action"].startswith("speed up the named span in your service")
    assert "'SELECT docs' (api) took 425 ms" in verdict["sentence"], verdict["sentence"]
    # retrieve's own time (outside its child) is normal: not the cause.
    assert [f["cause"] for f in verdict["findings"]] == ["backend"]
    # Counted on the collector's /metrics, which the alerts read (LLMBackendSlow).
    counts = {c: warm.value("llm_ttft_cause_total", model="m", cause=c)
              for c in ("cold_path", "unjudged", "healthy", "backend")}
    assert counts == {"cold_path": 1, "unjudged": MIN_SAMPLES - 1,
                      "healthy": WARM_TRACES - MIN_SAMPLES, "backend": 1}
    assert warm.value("llm_ttft_excess_seconds_total", model="m",
                      cause="backend") == pytest.approx(0.4, abs=0.0015)


def test_the_engines_queue_is_judged_from_its_segment(warm):
    verdict = _verdict(warm, WARM_TRACES, queue_s=0.4)["verdict"]
    assert verdict["cause"] == "queueing", verdict
    assert verdict["evidence"]["queue_ms"] == pytest.approx(400.0, abs=0.5)


def test_a_name_outside_the_closed_set_has_no_normal(warm):
    # A one-off step (its name seen once: `other` on the metrics) is on the path, but
    # nothing says what is normal for it: no backend verdict, however long.
    view = _verdict(warm, WARM_TRACES, extra=("fetch user 8f1c2", 300.0))
    assert ("backend", "fetch user 8f1c2", 300.0) in _segments(view)
    assert "backend" not in [f["cause"] for f in view["verdict"]["findings"]]


def test_with_diagnosis_off_the_path_has_no_verdict():
    app = App()
    app.parts = create_collector_app(
        CollectorSettings(ObservabilitySettings(beacon_key=KEY, diagnosis=False),
                          model_names=("m",)), registry=CollectorRegistry(), environ={})
    app.client = TestClient(app.parts.app)
    trace_id, spans, body = _trace(0)
    app.spans(spans)
    assert app.beacon(body) == 202
    view = app.trace(trace_id)
    assert view["stages"] and view["verdict"] is None
