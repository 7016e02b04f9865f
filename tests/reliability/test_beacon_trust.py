"""Issue 13 item 4: nobody can rewrite someone else's client timings, and the UI's data is
behind the API key. Against the real engine server on loopback."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import httpx
import pytest

from instrumented_engine.server.app import ServerSettings
from tracer.record.traceparent import parse_server_timing, parse_server_timing_desc
from tracer.web.observability import ObservabilitySettings

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(ServerSettings(ObservabilitySettings(api_key=KEY)))


def _chat(srv) -> httpx.Response:
    body = {"model": srv.model, "messages": MESSAGES, "max_tokens": 3, "stream": True}
    response = httpx.post(srv.base_url + "/v1/chat/completions", json=body, headers=AUTH,
                          timeout=60)
    assert response.status_code == 200
    srv.wait_idle()
    return response


def _beacon(trace_id: str, first_token_ms: float, token: str | None = None, **extra) -> dict:
    body = {"v": 1, "trace_id": trace_id, "outcome": "ok", "status": 200,
            "t": {"start": 0, "headers": first_token_ms - 2, "first_byte": first_token_ms - 1,
                  "first_token": first_token_ms, "end": first_token_ms + 5}, **extra}
    if token is not None:
        body["token"] = token
    return body


def _post(srv, beacon: dict) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/probe", content=json.dumps(beacon),
                      headers={"content-type": "text/plain"})


def _sample(srv, name: str, **labels) -> float:
    return srv.parts.obs.registry.get_sample_value(name, labels) or 0.0


def test_the_issues_attack_is_refused_and_the_real_beacon_then_wins(srv):
    response = _chat(srv)
    server_timing = response.headers["server-timing"]
    trace_id = parse_server_timing(server_timing).split("-")[1]
    token = parse_server_timing_desc(server_timing, "beacon")
    assert token == srv.parts.obs.beacon_signer.token(trace_id)
    ttft_sum = "llm_client_time_to_first_token_seconds_sum"
    sum_before = _sample(srv, ttft_sum, model=srv.model)

    # The attacker learned the trace id (e.g. from /ui/api/requests) and posts first: the
    # issue's beacon, then plausible ones without, with a forged and with another trace's token.
    issue_attack = _post(srv, _beacon(trace_id, 86_399_992.0, sdk="attacker"))
    assert issue_attack.status_code == 422   # implausible: refused before the token check
    unsigned = _post(srv, _beacon(trace_id, 50.0, sdk="attacker"))
    forged = _post(srv, _beacon(trace_id, 50.0, token="0" * 64, sdk="attacker"))
    other_trace = srv.parts.obs.beacon_signer.token("1" * 32)   # a real token, wrong trace
    replayed = _post(srv, _beacon(trace_id, 50.0, token=other_trace, sdk="attacker"))
    for refused, code in ((unsigned, "missing_beacon_token"), (forged, "invalid_beacon_token"),
                          (replayed, "invalid_beacon_token")):
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == code
    assert _sample(srv, "llm_probe_beacons_total", outcome="rejected_token") == 3
    assert srv.parts.obs.store.get(trace_id).client is None
    assert _sample(srv, ttft_sum, model=srv.model) == sum_before

    # An implausible TTFT is refused even with the right token, and never recorded.
    absurd = _post(srv, _beacon(trace_id, 86_399_992.0, token=token))
    assert absurd.status_code == 422 and absurd.json()["error"]["param"] == "t.headers"
    assert srv.parts.obs.store.get(trace_id).client is None

    # The browser's own beacon, with the token from its Server-Timing header, is joined.
    real = _post(srv, _beacon(trace_id, 120.0, token=token, sdk="ttftscope-probe/0.1.0"))
    assert real.status_code == 202
    client = srv.parts.obs.store.get(trace_id).client
    assert client["sdk"] == "ttftscope-probe/0.1.0" and client["client_ttft_ms"] == 120.0
    assert "token" not in client   # the token is checked, never stored
    assert _sample(srv, ttft_sum, model=srv.model) == pytest.approx(sum_before + 0.120)
    # First beacon wins: a second valid one changes nothing.
    assert _post(srv, _beacon(trace_id, 9.0, token=token)).status_code == 202
    assert srv.parts.obs.store.get(trace_id).client["client_ttft_ms"] == 120.0


def test_the_ui_data_needs_the_key_and_the_open_paths_do_not(srv):
    _chat(srv)
    for path in ("/ui/api/requests", "/ui/api/attribution",
                 f"/ui/api/trace/{'1' * 32}"):
        refused = httpx.get(srv.base_url + path)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert "trace_id" not in refused.text
    listed = httpx.get(srv.base_url + "/ui/api/requests", headers=AUTH)
    assert listed.status_code == 200 and listed.json()["requests"]
    for path in ("/health", "/metrics", "/ui/", "/ui/ui.js", "/demo", "/probe/probe.js"):
        assert httpx.get(srv.base_url + path).status_code == 200, path
    page = httpx.get(srv.base_url + "/ui/").text
    assert 'id="key-form"' in page   # the page asks for the key; ui.js keeps it per tab


def test_without_a_beacon_key_each_process_draws_its_own():
    from tracer.web.observability import build_observability
    one = build_observability(ObservabilitySettings(), model_names=("m",))
    two = build_observability(ObservabilitySettings(), model_names=("m",))
    shared = [build_observability(ObservabilitySettings(beacon_key="k"), model_names=("m",))
              for _ in range(2)]
    trace_id = "ab" * 16
    assert one.beacon_signer.token(trace_id) != two.beacon_signer.token(trace_id)
    assert shared[0].beacon_signer.token(trace_id) == shared[1].beacon_signer.token(trace_id)
    active = shared[0].tracer.begin(request_id="r", model="m", operation="chat",
                                    traceparent=None, start_ns=0)
    assert parse_server_timing_desc(active.server_timing, "beacon") == \
        shared[1].beacon_signer.token(active.trace_id)


def test_the_ui_page_asks_for_the_key_and_then_shows_the_requests(srv):
    """Real headless Chromium (as tests/integration/test_browser_e2e.py): ui.js sends the
    key it asked for; the key stays in sessionStorage, out of the URL."""
    node = shutil.which("node")
    assert node and pathlib.Path("/usr/bin/chromium").exists(), "needs node and chromium"
    trace_id = parse_server_timing(_chat(srv).headers["server-timing"]).split("-")[1]
    driver = pathlib.Path(__file__).with_name("ui_key_driver.mjs")
    run = subprocess.run([node, str(driver), json.dumps(
        {"baseUrl": srv.base_url, "key": KEY, "traceId": trace_id})],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["rowsBefore"] == 0 and result["rowShown"] and result["formHidden"]
    assert result["storedKey"] == KEY and KEY not in result["url"]
    assert result["pageErrors"] == []


def test_the_proxy_has_the_same_gate_and_tokens():
    from reliability_support import serve, wait_until
    from tracer.proxy.app import ProxySettings, create_proxy_app
    from tracer.testing.fake_upstream import MODEL, FakeUpstream

    upstream = FakeUpstream(chunks=3, gap_ms=0).start()
    parts = create_proxy_app(ProxySettings(
        upstream.base_url, observability=ObservabilitySettings(api_key=KEY)),
        model_names=(MODEL,))
    served = serve(parts.app)
    try:
        body = {"model": MODEL, "messages": MESSAGES, "stream": True}
        url = served.base_url + "/v1/chat/completions"
        refused = httpx.post(url, json=body)   # the hot path is gated too
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(served.base_url + "/ui/api/requests").status_code == 401
        assert httpx.get(served.base_url + "/health").status_code == 200
        response = httpx.post(url, json=body, headers=AUTH)
        assert response.status_code == 200
        server_timing = response.headers["server-timing"]
        trace_id = parse_server_timing(server_timing).split("-")[1]
        token = parse_server_timing_desc(server_timing, "beacon")
        assert wait_until(lambda: parts.obs.tracer.is_idle(10), 10)   # record published
        assert httpx.post(served.base_url + "/v1/probe", content=json.dumps(
            _beacon(trace_id, 20.0))).status_code == 403
        accepted = httpx.post(served.base_url + "/v1/probe",
                              content=json.dumps(_beacon(trace_id, 20.0, token=token)))
        assert accepted.status_code == 202
        assert parts.obs.store.get(trace_id).client["client_ttft_ms"] == 20.0
    finally:
        served.stop()
        upstream.stop()
