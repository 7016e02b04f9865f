"""Issue 34, item 5: the proxy in front of Ollama's native API. `/api/chat` and
`/api/generate` stream NDJSON (tracer/proxy/ollama_stream.py); the fake upstream replays the
lines of Ollama's docs (tracer/testing/ollama_upstream.py), each line cut across two reads,
with a pause before the first text. The final line's `load_duration` becomes `model_load`,
`prompt_eval_duration` the `prefill`, placed end-anchored; hostile values leave the stage sum
and every metric whole."""
from __future__ import annotations

import json
import math

import httpx
import pytest

from tracer.engines.placement import REJECTIONS
from tracer.proxy.engine_join import JoinSettings
from tracer.proxy.ollama_stream import OllamaScanner
from tracer.record.stages import PROXY_STAGES
from tracer.testing.fake_upstream import FakeUpstream
from tracer.testing.ollama_upstream import (
    MODEL,
    NDJSON,
    chat_lines,
    generate_lines,
    ollama_recordings,
    recording,
)
from tracer.testing.recording import Recording

HOLD_MS = 150.0
MS = 1_000_000
FINAL = {"total_duration": 900 * MS, "load_duration": 40 * MS, "prompt_eval_count": 26,
         "prompt_eval_duration": 30 * MS, "eval_count": 2, "eval_duration": 5 * MS}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "why is the sky blue?"}]}
GENERATE = {"model": MODEL, "prompt": "Why is the sky blue?"}
JOINED = ["receive", "upstream_connect", "upstream_other", "model_load", "prefill", "send"]


@pytest.fixture
def ollama():
    started: list[FakeUpstream] = []

    def start(final: dict = FINAL, **kwargs) -> FakeUpstream:
        upstream = FakeUpstream(recordings=ollama_recordings(final, hold_ms=HOLD_MS, **kwargs))
        started.append(upstream.start())
        return upstream

    yield start
    for upstream in started:
        upstream.stop()


def _through(proxy, upstream, path: str, body: dict, headers: dict | None = None):
    with httpx.Client(timeout=30, trust_env=False) as client:
        response = client.post(proxy.base_url + path, json=body, headers=headers or {})
    proxy.wait_idle(timeout_s=5)
    seen = upstream.state.requests[-1]
    record = proxy.parts.obs.store.get(seen.headers["traceparent"].split("-")[1])
    assert record is not None
    # The stages end at the first output of any kind (docs/architecture.md, "First output,
    # by kind"): where Ollama's prompt evaluation ends; the output segments (`reasoning`)
    # then reach the first text.
    end = [s.stage for s in record.stages].index("send") + 1
    assert record.first_output_ns == sum(s.duration_ns for s in record.stages[:end])
    if record.ttft_ns is not None:
        assert record.ttft_ns == sum(s.duration_ns for s in record.stages)
    assert all(s.duration_ns >= 0 for s in record.stages)
    return response, record


@pytest.mark.parametrize("path,body,operation", [("/api/chat", CHAT, "chat"),
                                                 ("/api/generate", GENERATE, "text_completion")])
def test_load_and_prompt_evaluation_become_stages(proxy_factory, ollama, path, body, operation):
    upstream = ollama()
    proxy = proxy_factory(upstream.base_url)
    response, record = _through(proxy, upstream, path, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == NDJSON.decode()
    assert response.content == upstream.recordings[path].body   # relayed byte for byte
    assert [s.stage for s in record.stages] == [*JOINED, "reasoning"]
    assert record.stage_ns("model_load") == 40 * MS
    assert record.stage_ns("prefill") == 30 * MS
    # The empty role line before the pause ended nothing; the thinking line after it is the
    # first output and ends the stages; TTFT ends at the first text, not before.
    assert record.first_output_kind == "reasoning"
    assert record.ttft_ns >= record.first_output_ns >= HOLD_MS * MS
    assert record.operation == operation
    assert record.attrs["stream"] is True          # Ollama streams unless told not to
    assert record.attrs["llm.engine.source"] == "ollama"
    assert record.attrs["llm.engine.placement"] == "end_anchored"
    assert record.attrs["llm.engine.model_load_ns"] == 40 * MS
    assert (record.num_prompt_tokens, record.num_output_tokens) == (26, 2)
    assert record.finish_reason == "stop"
    assert proxy.metric("llm_engine_timing_total", source="ollama", outcome="joined") == 1
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="model_load") == 1
    assert proxy.metric("llm_request_stage_duration_seconds_sum",
                        stage="model_load") == pytest.approx(0.040)


def test_the_docs_example_is_inconsistent_with_a_shorter_window(proxy_factory, ollama):
    """The docs' final line claims 342 ms of prompt evaluation; the pause is 150 ms: that
    signal is not this request's first token, so the proxy's five stages stay."""
    upstream = ollama(final=None)
    proxy = proxy_factory(upstream.base_url)
    _, record = _through(proxy, upstream, "/api/chat", CHAT)
    assert [s.stage for s in record.stages] == [*PROXY_STAGES, "reasoning"]
    assert record.attrs["llm.engine.placement"] == "inconsistent"
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="prefill") == 0


def test_durations_longer_than_the_first_output_wait_are_reported_not_placed(proxy_factory,
                                                                             ollama):
    """An Ollama whose final line claims 200 ms of load and 250 ms of prompt evaluation, when
    its first output came 150 ms after the request: not placed, and not dropped silently
    either. The record says why with the numbers, the counter moves by engine and reason,
    and /ui's view of the trace carries the sentence beside the waterfall."""
    upstream = ollama(final={**FINAL, "load_duration": 200 * MS,
                             "prompt_eval_duration": 250 * MS})
    proxy = proxy_factory(upstream.base_url)
    _, record = _through(proxy, upstream, "/api/chat", CHAT)
    assert [s.stage for s in record.stages] == [*PROXY_STAGES, "reasoning"]
    window_ms = (record.stage_ns("upstream_ttfb") + record.stage_ns("upstream_first_token")) / MS
    assert HOLD_MS <= window_ms < 450
    assert record.attrs["llm.engine.rejection"] == "exceeds_window"
    window_text = f"{window_ms:.1f}".removesuffix(".0")
    assert record.attrs["llm.engine.rejection_detail"] == (
        f"ollama: load + prefill 450 ms exceed the {window_text} ms observed before the first "
        "output")
    rejected = {reason: proxy.metric("llm_engine_timing_rejected_total", source="ollama",
                                     reason=reason) for reason in REJECTIONS}
    assert rejected == {**dict.fromkeys(REJECTIONS, 0.0), "exceeds_window": 1.0}
    with httpx.Client(timeout=30, trust_env=False) as client:
        view = client.get(f"{proxy.base_url}/ui/api/trace/{record.trace_id}").json()
    assert view["engine_timing_rejected"] == record.attrs["llm.engine.rejection_detail"]
    assert [s["stage"] for s in view["stages"]] == [*PROXY_STAGES, "reasoning"]


def test_durations_that_fit_are_placed_and_nothing_is_reported(proxy_factory, ollama):
    upstream = ollama()
    proxy = proxy_factory(upstream.base_url)
    _, record = _through(proxy, upstream, "/api/chat", CHAT)
    assert record.stage_ns("prefill") == 30 * MS
    assert "llm.engine.rejection" not in record.attrs
    assert sum(proxy.metric("llm_engine_timing_rejected_total", source="ollama", reason=r)
               for r in REJECTIONS) == 0


@pytest.mark.parametrize("bad", [-5, "40000000", True, None, math.nan, 10**30, 1e300, [1], {}])
def test_a_hostile_load_is_unknown_and_the_prefill_still_places(proxy_factory, ollama, bad):
    upstream = ollama(final={**FINAL, "load_duration": bad, "prompt_eval_count": -3,
                             "eval_count": "2"})
    proxy = proxy_factory(upstream.base_url)
    _, record = _through(proxy, upstream, "/api/generate", GENERATE)
    assert [s.stage for s in record.stages] == [
        "receive", "upstream_connect", "upstream_other", "prefill", "send", "reasoning"]
    assert record.stage_ns("prefill") == 30 * MS
    assert "llm.engine.model_load_ns" not in record.attrs
    assert record.num_prompt_tokens == 0            # a negative count is no count
    assert record.num_output_tokens == 2            # the lines with text, counted
    assert proxy.metric("llm_request_stage_duration_seconds_count", stage="model_load") == 0


@pytest.mark.parametrize("final", [{}, {"load_duration": -1, "prompt_eval_duration": math.inf},
                                   {"load_duration": "1s"}])
def test_nothing_usable_is_no_signal(proxy_factory, ollama, final):
    upstream = ollama(final=final)
    proxy = proxy_factory(upstream.base_url)
    _, record = _through(proxy, upstream, "/api/chat", CHAT)
    assert [s.stage for s in record.stages] == [*PROXY_STAGES, "reasoning"]
    assert "llm.engine.source" not in record.attrs
    assert proxy.metric("llm_engine_timing_total", source="ollama", outcome="joined") == 0


def test_a_cold_load_longer_than_the_prefill_is_its_own_stage(proxy_factory, ollama):
    upstream = ollama(final={"load_duration": 120 * MS, "prompt_eval_duration": 2 * MS})
    proxy = proxy_factory(upstream.base_url, join=JoinSettings(wait_s=30.0))
    _, record = _through(proxy, upstream, "/api/chat", CHAT)
    assert record.stage_ns("model_load") == 120 * MS
    assert max(record.stages, key=lambda s: s.duration_ns).stage == "model_load"


def test_a_tool_call_without_text_ends_the_stages_not_ttft(proxy_factory, ollama):
    lines = chat_lines(FINAL, texts=(), thinking=None)
    call = json.dumps({"model": MODEL, "created_at": "t", "done": False, "message": {
        "role": "assistant", "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}},
        separators=(",", ":")).encode() + b"\n"
    upstream = ollama()
    upstream.recordings["/api/chat"] = Recording(b"".join([lines[0], call, lines[-1]]), NDJSON,
                                                 hold_at=len(lines[0]), hold_ms=HOLD_MS)
    proxy = proxy_factory(upstream.base_url)
    _, record = _through(proxy, upstream, "/api/chat", CHAT)
    assert record.num_output_tokens == 2          # eval_count: the answer was a call
    assert record.first_output_kind == "tool_call" and record.ttft_ns is None
    assert record.stage_ns("model_load") == 40 * MS


def test_a_non_streamed_answer(proxy_factory, ollama):
    whole = {"model": MODEL, "created_at": "2023-12-12T14:13:43.416799Z",
             "message": {"role": "assistant", "content": "Hello! How are you today?"},
             "done": True, **FINAL}
    upstream = ollama()
    upstream.recordings["/api/chat"] = Recording(json.dumps(whole).encode(),
                                                 b"application/json; charset=utf-8",
                                                 hold_at=0, hold_ms=HOLD_MS)
    proxy = proxy_factory(upstream.base_url)
    response, record = _through(proxy, upstream, "/api/chat", {**CHAT, "stream": False})
    assert response.json()["message"]["content"].startswith("Hello")
    assert record.attrs["stream"] is False
    assert record.stage_ns("model_load") == 40 * MS
    assert record.num_output_tokens == 2


def test_a_cut_stream_ends_with_an_ollama_error_line(proxy_factory, ollama):
    lines = chat_lines(FINAL)
    upstream = ollama()
    # No final line: the stream closes cleanly by its framing, before `done`.
    upstream.recordings["/api/chat"] = recording(lines[:-1], hold_ms=HOLD_MS)
    proxy = proxy_factory(upstream.base_url)
    response, record = _through(proxy, upstream, "/api/chat", CHAT)
    last = json.loads(response.content.splitlines()[-1])
    assert "error" in last and isinstance(last["error"], str)
    assert record.error_type == "upstream"


def test_the_inband_timing_opt_in_is_refused(proxy_factory, ollama):
    upstream = ollama()
    proxy = proxy_factory(upstream.base_url)
    with httpx.Client(timeout=30, trust_env=False) as client:
        response = client.post(proxy.base_url + "/api/chat", json=CHAT,
                               headers={"x-ttft-timing": "1"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_option"
    assert upstream.state.requests == []


def test_the_first_content_rule_per_route():
    """/api/chat: `message.content`; /api/generate: `response`; `thinking` is neither."""
    for lines in (chat_lines(FINAL), generate_lines(FINAL)):
        scanner = OllamaScanner()
        assert [scanner.feed(line) for line in lines][-4:] == [0, 1, 1, 0]
        assert [m[1] for m in scanner.take_moments()] == ["reasoning"]


def test_a_line_split_anywhere_and_an_overlong_line_are_bounded():
    body = b"".join(generate_lines(FINAL))
    for cut in range(1, len(body)):
        scanner = OllamaScanner()
        assert scanner.feed(body[:cut]) + scanner.feed(body[cut:]) == 2
        assert scanner.summary.done and scanner.summary.ollama_final["load_duration"] == 40 * MS
    scanner = OllamaScanner(max_line_bytes=64)
    assert scanner.feed(b'{"response":"' + b"x" * 100) == 0
    assert scanner.pending is False                 # dropped, not buffered
    assert scanner.feed(b'x","done":false}\n{"response":"y","done":false}\n') == 1


def test_an_sse_answer_on_an_ollama_route_is_relayed_whole_and_timed(proxy_factory):
    """An upstream that answers /api/chat in SSE is not Ollama: the SSE default rule reads
    it (the Ollama scanner reads NDJSON only), and the stream reaches the client whole
    (schemathesis found this route answering a broken chunked body)."""
    upstream = FakeUpstream(chunks=3, gap_ms=0).start()
    try:
        proxy = proxy_factory(upstream.base_url)
        response, record = _through(proxy, upstream, "/api/chat",
                                    {"model": None, "stream": True, "max_tokens": "x"})
    finally:
        upstream.stop()
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    assert record.ttft_ns is not None and record.finish_reason == "stop"
