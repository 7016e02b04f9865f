"""The in-band timing line on the real engine (tracer/web/inband.py, docs/reference.md, "The
in-band timing line"): only with `X-TTFT-Timing: 1`, one SSE comment right before
`data: [DONE]`, signed, with the server's own timing; the `openai` SDK reads such a stream as
if the line were not there, and without the header the stream is unchanged."""
from __future__ import annotations

import re

import httpx
import openai

from tracer.record.traceparent import parse_server_timing
from tracer.web.inband import decode_token

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
BODY = {"messages": MESSAGES, "temperature": 0, "max_tokens": 12, "stream": True,
        "stream_options": {"include_usage": True}}
LINE = re.compile(rb": ttft-timing ([A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43})\n\n")
# What differs between two runs of the same greedy request: the completion id and the time.
_VOLATILE = re.compile(rb'"id":"chatcmpl-[0-9a-f]{32}","object":"chat.completion.chunk",'
                       rb'"created":\d+')


def raw_stream(live, headers: dict | None = None) -> tuple[bytes, httpx.Headers]:
    with httpx.stream("POST", live.base_url + "/v1/chat/completions", timeout=60,
                      json={**BODY, "model": live.model}, headers=headers or {}) as r:
        assert r.status_code == 200
        return b"".join(r.iter_raw()), r.headers


def normalized(body: bytes) -> bytes:
    return _VOLATILE.sub(b'"id":"ID","object":"chat.completion.chunk","created":0', body)


def test_without_the_header_the_stream_is_unchanged_and_with_it_one_comment_precedes_done(live):
    raw_stream(live)   # warm the prefix cache: every run below then reports the same usage
    plain, _ = raw_stream(live)
    assert b"ttft-timing" not in plain and plain.endswith(b"data: [DONE]\n\n")
    # Any value other than 1 is no opt-in: byte for byte the same stream.
    refused, _ = raw_stream(live, {"X-TTFT-Timing": "0"})
    assert normalized(refused) == normalized(plain)
    timed, headers = raw_stream(live, {"X-TTFT-Timing": "1"})
    lines = LINE.findall(timed)
    assert len(lines) == 1
    line = b": ttft-timing " + lines[0] + b"\n\n"
    # Exactly the plain stream with the comment inserted right before [DONE].
    assert normalized(timed) == normalized(plain).replace(b"data: [DONE]\n\n",
                                                          line + b"data: [DONE]\n\n")
    assert headers["x-accel-buffering"] == "no"


def test_the_token_is_signed_and_carries_the_records_timing(live):
    timed, headers = raw_stream(live, {"X-TTFT-Timing": "1"})
    token = LINE.search(timed).group(1).decode()
    timing = decode_token(token, live.parts.obs.beacon_signer)   # raises when forged
    trace_id = parse_server_timing(headers["server-timing"]).split("-")[1]
    live.wait_idle()
    record = live.parts.obs.store.get(trace_id)
    assert (timing.trace_id, timing.span_id, timing.source, timing.model) == (
        trace_id, record.span_id, "engine", live.model)
    assert timing.recv_unix_ns == live.parts.obs.clock.to_epoch_ns(record.start_ns)
    assert abs(timing.ttft_ms - record.ttft_ns / 1e6) < 0.002
    num_content = record.itl.count + 1
    assert len(timing.send_ms) == min(num_content, 32) and timing.send_ms[0] == timing.ttft_ms
    assert 0 < timing.resp_ms <= timing.ttft_ms
    # Its stages are the record's, up to the µs rounding.
    assert {s.stage: round(s.duration_ns / 1e6, 3) for s in record.stages} == timing.stages_ms
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    try:
        decode_token(tampered, live.parts.obs.beacon_signer)
    except ValueError:
        pass
    else:
        raise AssertionError("a tampered signature was accepted")


class Tap(httpx.BaseTransport):
    """A real HTTP transport that keeps a copy of every response body it streams."""

    def __init__(self) -> None:
        self.inner, self.seen = httpx.HTTPTransport(), bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        tap = self

        class Copying(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in response.stream:
                    tap.seen += chunk
                    yield chunk

            def close(self) -> None:
                response.stream.close()
        return httpx.Response(response.status_code, headers=response.headers, stream=Copying(),
                              extensions=response.extensions)


def test_openai_sdk_reads_the_timed_stream_like_the_plain_one(live):
    tap = Tap()
    c = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused", max_retries=0,
                      http_client=httpx.Client(transport=tap, timeout=60))
    kwargs = dict(model=live.model, messages=MESSAGES, temperature=0, max_tokens=12,
                  stream=True, stream_options={"include_usage": True})
    plain = list(c.chat.completions.create(**kwargs))
    assert b"ttft-timing" not in tap.seen
    timed = list(c.chat.completions.create(**kwargs, extra_headers={"X-TTFT-Timing": "1"}))
    assert len(LINE.findall(bytes(tap.seen))) == 1     # the SDK did read the comment line
    text = lambda chunks: "".join(ch.choices[0].delta.content or "" for ch in chunks  # noqa: E731
                                  if ch.choices)
    assert text(timed) == text(plain) != ""
    assert len(timed) == len(plain)
    assert timed[-1].usage.completion_tokens == plain[-1].usage.completion_tokens > 0
