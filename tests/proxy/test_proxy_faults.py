"""The fault table: every way the upstream or the client can fail gives the right status or
stream termination, one counted `error_type`, an error span, and leaves no busy connection
and no stray asyncio task behind."""
from __future__ import annotations

import json

import httpx
from opentelemetry.trace import StatusCode

from proxy_support import closed_port, wait_until
from tracer.testing.fake_upstream import MODEL

DURATION_COUNT = "gen_ai_server_request_duration_seconds_count"
STREAM = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def errors_counted(proxy, error_type: str) -> float:
    return proxy.metric(DURATION_COUNT, gen_ai_request_model=MODEL,
                        gen_ai_operation_name="chat", error_type=error_type)


def chat_span(proxy, record):
    (span,) = [s for s in proxy.spans.get_finished_spans()
               if s.name == f"chat {MODEL}" and f"{s.context.span_id:016x}" == record.span_id]
    return span


def only_record(proxy):
    proxy.wait_idle()
    (record,) = proxy.parts.obs.store.recent(10)
    return record


def assert_failed(proxy, record, error_type: str, finish_reason: str = "error") -> None:
    assert (record.error_type, record.finish_reason) == (error_type, finish_reason)
    assert errors_counted(proxy, error_type) == 1
    assert proxy.metric("llm_requests_total", model=MODEL, finish_reason=finish_reason) == 1
    span = chat_span(proxy, record)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == error_type


def test_upstream_refusing_connections_is_a_502(proxy_factory):
    proxy = proxy_factory(f"http://127.0.0.1:{closed_port()}")
    response = httpx.post(proxy.base_url + "/v1/chat/completions", json=STREAM)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unavailable" and error["type"] == "upstream_error"
    record = only_record(proxy)
    assert response.headers["x-request-id"] == record.request_id
    assert record.trace_id in response.headers["server-timing"]
    assert_failed(proxy, record, "upstream_unavailable")
    assert record.ttft_ns is None and [s.stage for s in record.stages] == ["receive"]


def test_upstream_slow_to_first_byte_is_a_504_and_the_upstream_is_let_go(proxy_factory,
                                                                          fake_upstream):
    from tracer.proxy.upstream import UpstreamLimits
    proxy = proxy_factory(fake_upstream.base_url, limits=UpstreamLimits(read_timeout_s=0.3))
    response = httpx.post(proxy.base_url + "/v1/chat/completions", json=STREAM,
                          headers={"x-fake-mode": "slow_headers"}, timeout=10)
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    assert_failed(proxy, only_record(proxy), "timeout")
    # The proxy closed the connection it gave up on: the upstream saw the client leave.
    assert fake_upstream.state.disconnected_while_busy.wait(5)
    assert wait_until(lambda: fake_upstream.state.num_open_connections == 0)


def test_upstream_500_is_relayed_with_its_body(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    headers = {"x-fake-mode": "status_500"}
    direct = httpx.post(fake_upstream.base_url + "/v1/chat/completions", json=STREAM,
                        headers=headers)
    response = httpx.post(proxy.base_url + "/v1/chat/completions", json=STREAM, headers=headers)
    assert response.status_code == direct.status_code == 500
    assert response.content == direct.content
    assert response.headers["content-type"] == "application/json"
    record = only_record(proxy)
    assert_failed(proxy, record, "upstream_status")
    assert record.attrs["llm.upstream.status_code"] == 500


def test_stream_cut_midway_ends_the_client_stream_with_an_error_event(proxy_factory,
                                                                      fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=STREAM,
                      headers={"x-fake-mode": "cut"}) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    payloads = [json.loads(e) for e in events]
    contents = [p["choices"][0]["delta"].get("content") for p in payloads if "choices" in p]
    assert contents == ["", "tok0 ", "tok1 ", "tok2 "]
    assert payloads[-1]["error"]["code"] == "upstream_stream_cut"
    assert "[DONE]" not in events
    record = only_record(proxy)
    assert_failed(proxy, record, "upstream")
    # The tokens that did arrive were timed: the stream failed after its first token.
    assert record.ttft_ns is not None and record.itl.count == 2


def test_client_disconnect_cancels_the_upstream_request(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    with httpx.Client() as client:
        with client.stream("POST", proxy.base_url + "/v1/chat/completions", json=STREAM,
                           headers={"x-fake-mode": "hold"}) as response:
            for line in response.iter_lines():
                if "tok0" in line:
                    break   # first token seen: leave with the stream still open
    assert fake_upstream.state.disconnected_while_busy.wait(10), "upstream never saw the abort"
    record = only_record(proxy)
    assert_failed(proxy, record, "abort", finish_reason="abort")
    assert record.ttft_ns is not None


def test_a_client_leaving_right_after_done_is_not_an_abort(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    with httpx.Client() as client:
        with client.stream("POST", proxy.base_url + "/v1/chat/completions", json=STREAM,
                           headers={"x-fake-mode": "linger"}) as response:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    break   # what the OpenAI SDK does: stop reading, close the response
    assert fake_upstream.state.disconnected_while_busy.wait(10)
    record = only_record(proxy)
    assert (record.finish_reason, record.error_type) == ("stop", None)
    assert errors_counted(proxy, "") == 1 and errors_counted(proxy, "abort") == 0


def test_client_disconnect_before_the_upstream_answers_cancels_it_too(proxy_factory,
                                                                      fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    # The fake answers `slow_headers` only when its client leaves: the proxy must leave when
    # our client does, although no response has started yet.
    with httpx.Client(timeout=httpx.Timeout(10, read=0.3)) as client:
        try:
            client.post(proxy.base_url + "/v1/chat/completions", json=STREAM,
                        headers={"x-fake-mode": "slow_headers"})
            raise AssertionError("the proxy answered a request the upstream never answered")
        except httpx.ReadTimeout:
            pass
    assert fake_upstream.state.disconnected_while_busy.wait(10)
    assert_failed(proxy, only_record(proxy), "abort", finish_reason="abort")


def test_the_whole_fault_table_leaks_no_connection_and_no_task(proxy_factory, fake_upstream):
    from tracer.proxy.upstream import UpstreamLimits
    proxy = proxy_factory(fake_upstream.base_url, limits=UpstreamLimits(read_timeout_s=0.3))
    url = proxy.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        assert client.post(url, json={**STREAM, "stream": False}).status_code == 200
    proxy.wait_idle()
    baseline_tasks = proxy.app.num_tasks()
    with httpx.Client() as client:
        for mode in ("stream", "status_500", "slow_headers", "cut", "stream"):
            with client.stream("POST", url, json=STREAM, headers={"x-fake-mode": mode}) as r:
                r.read()
        with client.stream("POST", url, json=STREAM, headers={"x-fake-mode": "hold"}) as r:
            next(r.iter_raw())
    assert fake_upstream.state.disconnected_while_busy.wait(10)
    proxy.wait_idle()
    assert proxy.parts.obs.store.recent(100)[0].finish_reason == "abort"
    assert len(proxy.parts.obs.store) == 7
    # Every pooled connection is idle, and each one still open on the proxy's side is one
    # the upstream also holds open (the broken and abandoned ones were closed).
    assert wait_until(lambda: proxy.parts.upstream.pool_state()[1] == 0)
    assert wait_until(lambda: fake_upstream.state.num_open_connections
                      == proxy.parts.upstream.pool_state()[0])
    assert wait_until(lambda: proxy.app.num_tasks() == baseline_tasks), proxy.app.num_tasks()
    assert proxy.parts.obs.tracer.num_sink_errors == 0
