"""The collector joins a trace from its parts (docs/architecture.md, "The whole path"): the
backend's and the engine's OTLP spans and the probe's beacon, in any order, into contiguous
segments summing to client TTFT; forged parents change nothing; a trace that never
completes leaves after its wait, counted; every bound holds."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tracer.collect.app import CollectorSettings, create_collector_app
from tracer.collect.pending import PendingTraces
from tracer.sinks.path_metrics import PathMetrics
from tracer.web.observability import ObservabilitySettings
from whole_path_support import (
    CLIENT, INTERNAL, KEY, SERVER, SIGNER, backend_trace, beacon, export, now_base_ns, span,
)

JSON = {"content-type": "application/json"}
T1 = "4bf92f3577b34da6a3ce929d0e0e4736"


class App:
    def __init__(self, relay_transport=None, **settings) -> None:
        self.registry = CollectorRegistry()
        self.parts = create_collector_app(
            CollectorSettings(ObservabilitySettings(beacon_key=KEY), model_names=("m",),
                              path_segments=("auth",), **settings),
            registry=self.registry, environ={}, relay_transport=relay_transport)
        self.client = TestClient(self.parts.app)

    def spans(self, spans) -> None:
        assert self.client.post("/v1/traces", content=export(spans), headers=JSON).status_code == 200

    def beacon(self, body) -> int:
        return self.client.post("/v1/probe", content=json.dumps(body),
                                headers={"content-type": "text/plain"}).status_code

    def trace(self, trace_id):
        answer = self.client.get(f"/ui/api/trace/{trace_id}")
        return answer.json() if answer.status_code == 200 else None

    def value(self, name, **labels):
        return self.registry.get_sample_value(name, labels) or 0.0


def _segments(view):
    return [(s["attrs"]["part"], s["stage"], round(s["duration_ms"], 3)) for s in view["stages"]]


@pytest.mark.parametrize("order", ["beacon_first", "spans_first"])
def test_a_trace_is_joined_whatever_order_its_parts_come_in(order):
    app = App()
    spans = backend_trace(T1, now_base_ns())
    if order == "beacon_first":
        assert app.beacon(beacon(T1)) == 202
        assert app.trace(T1) is None and len(app.parts.pending) == 1
    app.spans(spans[-1:])        # the engine's export
    app.spans(spans[:-1])        # the backend's
    if order == "spans_first":
        assert app.trace(T1) is None
        assert app.beacon(beacon(T1)) == 202
    view = app.trace(T1)
    # The browser saw headers at 43 ms for the backend's [0, 41] (+ the send span at 41):
    # the midpoints put fetch at -1 ms on the backend's clock.
    assert _segments(view) == [
        ("network", "network", 1.0), ("backend", "POST /chat", 1.0), ("backend", "auth", 4.0),
        ("backend", "retrieve", 5.0), ("backend", "SELECT docs", 25.0),
        ("backend", "retrieve", 5.0), ("backend", "POST /chat", 1.0),
        ("network", "backend_to_engine", 2.0), ("engine", "queue", 20.0),
        ("engine", "prefill", 40.0), ("engine", "engine_other", 2.0),
        ("network", "first_token", 214.0)]
    assert sum(d for *_, d in _segments(view)) == pytest.approx(view["client"]["client_ttft_ms"])
    assert view["source"] == "collector" and view["model"] == "m"
    assert view["server_ttft_ms"] == pytest.approx(105.0)   # root start → engine first token
    assert app.value("llm_collector_traces_total", outcome="complete") == 1
    assert app.value("llm_path_segment_seconds_count", model="m", part="backend",
                     segment="auth") == 1
    # the other backend names are not labels yet (seen in one trace): `other`
    assert app.value("llm_path_segment_seconds_sum", model="m", part="backend",
                     segment="other") == pytest.approx(0.037)
    assert app.value("llm_client_time_to_first_token_seconds_count", model="m") == 1
    assert app.value("llm_collector_pending_traces") == 0


def test_forged_parents_write_nothing_into_someone_elses_trace():
    app = App()
    base = now_base_ns()
    spans = backend_trace(T1, base)
    evil = [  # another service that learned the trace id and both visible span ids
        span(T1, "e" * 16, "1" * 16, "evil", 0, 299, base_ns=base, service="evil"),
        span(T1, "f" * 16, "b" * 16, "POST /evil", 0, 299, base_ns=base, kind=SERVER,
             service="evil"),
        span(T1, "d" * 16, "1" * 16, "evil too", 0, 299, base_ns=base, kind=SERVER,
             service="evil")]
    app.spans(evil)
    app.spans(spans)
    app.spans(spans[2:3])        # an exporter's retry of one span
    assert app.beacon(beacon(T1)) == 202
    names = [n for _, n, _ in _segments(app.trace(T1))]
    assert not any("evil" in n for n in names), names
    assert "SELECT docs" in names and names.count("auth") == 1
    assert app.value("llm_collector_spans_total", outcome="forged_parent") == 2
    assert app.value("llm_collector_spans_total", outcome="duplicate") == 1


def test_a_forged_copy_of_the_root_denies_the_waterfall_and_writes_nothing():
    app = App()
    base = now_base_ns()
    app.spans([span(T1, "1" * 16, "b" * 16, "evil root", 0, 299, base_ns=base, kind=SERVER,
                    service="evil")])
    app.spans(backend_trace(T1, base))
    assert app.beacon(beacon(T1)) == 202
    assert app.trace(T1) is None
    assert app.value("llm_collector_traces_total", outcome="no_path") == 1
    # the beacon's own client numbers are still observed
    assert app.value("llm_client_time_to_first_token_seconds_count", model="other") == 1


def test_without_an_engine_span_the_call_is_one_opaque_segment_after_the_wait():
    clock = [0]
    app = App(join_wait_s=1.0)
    app.parts.pending._clock_ns = lambda: clock[0]
    app.spans(backend_trace(T1, now_base_ns())[:-1])
    assert app.beacon(beacon(T1)) == 202
    assert app.parts.pending.expire() == 0 and app.trace(T1) is None
    clock[0] = 2 * 10**9
    assert app.parts.pending.expire() == 1
    segments = _segments(app.trace(T1))
    assert ("engine", "engine", 249.0) in segments and segments[-1][1] == "first_token"
    assert app.value("llm_collector_traces_total", outcome="partial") == 1


def test_our_engines_inband_timing_fills_the_engine_part():
    from tracer.web.inband import InbandTiming, encode_token
    app = App()
    base = now_base_ns()
    spans = backend_trace(T1, base)[:-1]      # no vLLM span: our engine answered
    timing = InbandTiming(T1, "9" * 16, "engine", "m", base + 42 * 10**6, 1.0, 30.0,
                          (30.0,), {"receive": 1.0, "queue": 4.0, "prefill": 25.0})
    app.spans(spans)
    assert app.beacon(beacon(T1, server=encode_token(timing, SIGNER))) == 202
    segments = _segments(app.trace(T1))
    assert [(p, n) for p, n, _ in segments if p == "engine"] == [
        ("engine", "receive"), ("engine", "queue"), ("engine", "prefill")]
    assert ("network", "backend_to_engine", 1.0) in segments
    assert sum(d for *_, d in segments) == pytest.approx(320.0)
    # the in-band join observed the client metrics once, not the assembly again
    assert app.value("llm_client_time_to_first_token_seconds_count", model="m") == 1


def test_bounds_eviction_per_trace_spans_and_late_parts():
    ready = []
    metrics = PathMetrics(CollectorRegistry(), ("m", "other"))
    pending = PendingTraces(lambda t, trace, evicted: ready.append((t, evicted)), metrics,
                            max_traces=2, max_spans_per_trace=3, clock_ns=lambda: 0)
    base = now_base_ns()
    ids = [f"{i:032x}" for i in range(1, 4)]
    pending.add_spans([span(ids[0], f"{j:016x}", "", "x", 0, 1, base_ns=base)
                       for j in range(1, 6)] and [])
    from tracer.engines.spans import SpanView
    views = [SpanView(ids[0], f"{j:016x}", "", "x", 1, {}, 2) for j in range(1, 6)]
    pending.add_spans(views)
    assert len(pending._pending[ids[0]].spans) == 3
    pending.add_spans([SpanView(ids[1], "1" * 16, "", "x", 1, {}, 2)])
    pending.add_spans([SpanView(ids[2], "1" * 16, "", "x", 1, {}, 2)])   # evicts the oldest
    assert ready == [(ids[0], True)] and len(pending) == 2
    pending.add_spans([SpanView(ids[0], "9" * 16, "", "late", 1, {}, 2)])
    value = metrics._spans
    assert value["over_limit"]._value.get() == 2 and value["late"]._value.get() == 1


def test_a_root_span_that_outlasts_the_browsers_stream_aligns_on_the_starts():
    """No response-start span (a Node backend) and a root span stamped 50 ms after the
    browser saw the stream end: the midpoint would put the fetch after the request arrived
    and swallow the backend's first segments; the starts are aligned instead."""
    app = App()
    spans = [s for s in backend_trace(T1, now_base_ns()) if "send" not in s["name"]]
    spans[0]["end"] += 80 * 10**6          # the root ends at 380 ms; the browser's end: 330
    app.spans(spans)
    assert app.beacon(beacon(T1)) == 202
    view = app.trace(T1)
    segments = _segments(view)
    assert segments[0] == ("backend", "POST /chat", 1.0)    # no uplink: the bound
    assert ("backend", "auth", 4.0) in segments and ("backend", "SELECT docs", 25.0) in segments
    assert view["client"]["clock"]["anchor"] == "end"
    assert sum(d for *_, d in segments) == pytest.approx(320.0)


def test_an_engine_clock_too_far_off_makes_the_engine_one_opaque_segment():
    app = App()
    spans = backend_trace(T1, now_base_ns())
    spans[-1]["start"] -= 500 * 10**6          # vLLM's host clock 500 ms behind the backend's
    spans[-1]["end"] -= 500 * 10**6
    app.spans(spans)
    assert app.beacon(beacon(T1)) == 202
    segments = _segments(app.trace(T1))
    assert ("engine", "engine", 249.0) in segments          # the call, not placed stages
    assert not any(n in ("queue", "prefill") for _, n, _ in segments)
    assert sum(d for *_, d in segments) == pytest.approx(320.0)


def test_a_browser_that_reports_late_is_moved_as_causality_demands():
    """The browser's headers came 40 ms late (a busy machine): the midpoint of [0, 83] and
    the backend's [0, 41] (offset -21 ms, ± 21) puts its first token (110 ms after fetch) at
    89 ms, before the engine made it (43 + 62 = 105 ms), and the engine's stages could not be
    placed. Causality bounds the offset to [-5, 0] (the first token after the engine's, the
    fetch before the backend's receipt), inside the midpoint's [-42, 0]: the centre, -2.5
    ms, leaves both network legs 2.5 ms."""
    app = App()
    app.spans(backend_trace(T1, now_base_ns()))
    assert app.beacon(beacon(T1, headers=83.0, first_token=110.0)) == 202
    segments = _segments(app.trace(T1))
    assert segments[0] == ("network", "network", 2.5)
    assert ("engine", "queue", 20.0) in segments and ("engine", "prefill", 40.0) in segments
    assert segments[-2:] == [("engine", "engine_other", 2.0), ("network", "first_token", 2.5)]
    assert sum(d for *_, d in segments) == pytest.approx(110.0)


def test_when_the_bounds_leave_one_offset_it_is_taken():
    """The first token at 105 ms after fetch, the engine's own time after the backend's
    receipt: causality leaves one offset (0), with both network legs empty."""
    app = App()
    app.spans(backend_trace(T1, now_base_ns()))
    assert app.beacon(beacon(T1, headers=83.0, first_token=105.0)) == 202
    segments = _segments(app.trace(T1))
    assert segments[0][:2] == ("backend", "POST /chat")
    assert segments[-1] == ("engine", "engine_other", 2.0)
    assert sum(d for *_, d in segments) == pytest.approx(105.0)
