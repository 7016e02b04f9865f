"""The proxy's in-band timing line (tracer/web/inband.py): it consumes `X-TTFT-Timing: 1`
(the upstream never sees it) and puts its own signed line right before the upstream's
`data: [DONE]`, however the upstream's reads cut the stream; without the header the relayed
bytes are the upstream's, unchanged."""
from __future__ import annotations

import asyncio
import re

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.proxy.http1 import ResponseHead
from tracer.proxy.inband_splice import DoneSplitter, TimingLineStripper
from tracer.proxy.stream import Relay
from tracer.proxy.upstream_errors import UpstreamError
from tracer.record.timeline import NullTimeline
from tracer.record.traceparent import parse_server_timing
from tracer.testing.fake_upstream import MODEL
from tracer.web.inband import decode_token

LINE = re.compile(rb": ttft-timing ([A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43})\n\n")


def stream(proxy, headers: dict | None = None) -> tuple[bytes, httpx.Headers]:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=body, timeout=10,
                      headers=headers or {}) as r:
        assert r.status_code == 200
        return b"".join(r.iter_raw()), r.headers


def test_header_absent_bytes_unchanged_header_present_one_line_before_done(
        fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url)
    plain, plain_headers = stream(proxy)
    assert b"ttft-timing" not in plain and plain.endswith(b"data: [DONE]\n\n")
    assert plain_headers["x-accel-buffering"] == "no"   # the fake upstream does not say it
    timed, headers = stream(proxy, {"X-TTFT-Timing": "1"})
    (token,) = LINE.findall(timed)
    line = b": ttft-timing " + token + b"\n\n"
    assert timed == plain.replace(b"data: [DONE]\n\n", line + b"data: [DONE]\n\n")
    # Consumed: neither request reached the upstream with the header.
    assert all("x-ttft-timing" not in seen.headers for seen in fake_upstream.state.requests)
    proxy.wait_idle()
    timing = decode_token(token.decode(), proxy.parts.obs.beacon_signer)
    trace_id = parse_server_timing(headers["server-timing"]).split("-")[1]
    record = proxy.parts.obs.store.get(trace_id)
    assert (timing.trace_id, timing.span_id, timing.source, timing.model) == (
        trace_id, record.span_id, "proxy", MODEL)
    assert len(timing.send_ms) == 6 and abs(timing.ttft_ms - record.ttft_ns / 1e6) < 0.002
    assert set(timing.stages_ms) == {"receive", "upstream_connect", "upstream_ttfb",
                                     "upstream_first_token", "send"}


STREAM = (b'data: {"choices":[{"delta":{"content":"data: [DONE]"}}]}\n\n'
          b'data: {"choices":[{"delta":{"content":"b"}}]}\r\n\r\n'
          b"data: [DONE]\n\n")
MARK = b"<LINE>"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=10))
def test_any_cut_puts_the_line_right_before_done_and_nowhere_else(cuts):
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    splitter, out = DoneSplitter(), b""
    for a, b in zip(bounds, bounds[1:]):
        now, done = splitter.feed(STREAM[a:b])
        out += now
        if done is not None:
            out += MARK + done
    out += splitter.flush()
    # "[DONE]" inside a content string is data, not the end.
    assert out == STREAM.replace(b"data: [DONE]\n\n", MARK + b"data: [DONE]\n\n")


def test_done_after_any_blank_line_gets_the_line():
    # Every pair of SSE line ends is a blank line: LF then CR, CR then CRLF, LF then CRLF too.
    for blank in (b"\n\n", b"\r\r", b"\r\n\r\n", b"\n\r", b"\r\r\n", b"\n\r\n", b"\r\n\r"):
        stream = b'data: {"x":1}' + blank + b"data: [DONE]\n\n"
        for cut in range(len(stream) + 1):
            splitter, out = DoneSplitter(), b""
            for part in (stream[:cut], stream[cut:]):
                now, done = splitter.feed(part)
                out += now + (MARK + done if done is not None else b"")
            assert out + splitter.flush() == stream.replace(b"data: [D", MARK + b"data: [D")
    # A CRLF alone ends the data line only: [DONE] is in the same event.
    assert DoneSplitter().feed(b'data: {"x":1}\r\ndata: [DONE]\n\n')[1] is None


class _Exchange:
    """An upstream exchange that yields recorded reads."""

    def __init__(self, reads: list[bytes], overran: bool = False) -> None:
        self.reads, self.last_data_ns, self.aborted = list(reads), 0, False
        self.overran = overran

    async def read(self) -> bytes:
        return self.reads.pop(0) if self.reads else b""


class _Active:
    """A traced request's timeline, as far as the relay writes it."""

    def __init__(self) -> None:
        self.timeline = NullTimeline(0)


def _relay(reads: list[bytes], overran: bool = False, traced: bool = True) -> tuple[bytes, tuple]:
    head = ResponseHead(200, [(b"content-type", b"text/event-stream")], 0)
    relay = Relay(_Exchange(reads, overran), head, _Active() if traced else None,
                  timing=lambda: b": ttft-timing X\n\n")
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)
    asyncio.run(relay.run(send))
    return b"".join(m.get("body", b"") for m in sent), relay.outcome


FINISHED = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
            b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')


def test_an_upstream_without_done_gets_the_line_at_the_end():
    assert _relay([FINISHED[:10], FINISHED[10:]]) == (FINISHED + b": ttft-timing X\n\n",
                                                      ("stop", None))
    # A read ending inside what could be [DONE] is held back, then passed on unchanged.
    relayed, outcome = _relay([FINISHED + b"data: [DO"])
    assert relayed.startswith(FINISHED + b"data: [DO") and outcome == ("stop", None)


def test_a_stream_that_ends_before_its_end_event_is_an_upstream_error():
    # Cleanly framed, but no finish reason, no [DONE], no error event: cut short.
    first = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    relayed, outcome = _relay([first])
    assert outcome == ("error", "upstream")
    assert relayed.startswith(first) and b'"code": "upstream_stream_cut"' in relayed


class _Breaking(_Exchange):
    """Its reads, then the upstream's connection breaks."""

    async def read(self) -> bytes:
        if self.reads:
            return self.reads.pop(0)
        raise UpstreamError("the upstream closed the connection", received_any=True)


def test_bytes_held_back_are_sent_when_the_stream_breaks():
    # Found by tests/reliability/test_stream_fuzz.py: a read ending in what may start
    # `data: [DONE]` or `: ttft-timing` is held back; a break then lost it.
    for tail in (b"data: [DO", b": ttft-t", b":"):
        head = ResponseHead(200, [(b"content-type", b"text/event-stream")], 0)
        relay, sent = Relay(_Breaking([FINISHED[:20], FINISHED[20:] + tail]), head, _Active(),
                            timing=lambda: b": ttft-timing X\n\n"), []

        async def send(message: dict) -> None:
            sent.append(message)
        asyncio.run(relay.run(send))
        relayed = b"".join(m.get("body", b"") for m in sent)
        assert relayed.startswith(FINISHED + tail + b"\n\ndata: {\"error\""), relayed
        assert relay.outcome == ("error", "upstream")


def test_a_passthrough_stream_is_never_judged_or_added_to():
    first = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    relayed, _ = _relay([first], traced=False)
    assert b"upstream_stream_cut" not in relayed


def test_bytes_past_the_declared_length_are_an_upstream_error():
    relayed, outcome = _relay([FINISHED + b"data: [DONE]\n\n"], overran=True)
    assert outcome == ("error", "upstream") and b"declared Content-Length" in relayed


def test_the_upstreams_own_timing_line_is_replaced_by_ours():
    theirs = b": ttft-timing eyJmb3JnZWQiOjF9.AAAA\n\n"
    relayed, _ = _relay([FINISHED + theirs + b"data: [DONE]\n\n"])
    assert relayed == FINISHED + b"\n: ttft-timing X\n\ndata: [DONE]\n\n"
    assert relayed.count(b"ttft-timing") == 1


_LINES = st.sampled_from([b": ttft-timing abc.def", b":ttft-timing x", b": ttft-tim",
                          b": keep", b"data: x", b"data: : ttft-timing", b"", b": ttft-timingX"])
_ENDS = st.sampled_from([b"\n", b"\r", b"\r\n"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_LINES, _ENDS), max_size=12), st.data())
def test_stripping_does_not_depend_on_how_reads_cut_the_stream(lines, data):
    stream = b"".join(line + end for line, end in lines)
    # The reference: the whole stream cut into SSE lines (CRLF, CR or LF ends one).
    expected = b"".join(line for line in re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", stream)
                        if not re.match(rb": ?ttft-timing", line))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    stripper, out, prev = TimingLineStripper(), b"", 0
    for cut in [*cuts, len(stream)]:
        out += stripper.feed(stream[prev:cut])
        prev = cut
    assert out + stripper.flush() == expected


def test_forwarded_for_appends_the_tcp_peer_while_the_probe_sees_the_forwarded_client(
        fake_upstream, proxy_factory):
    # Loopback is a trusted proxy by default (--forwarded-allow-ips 127.0.0.1): FastAPI's
    # paths see the browser's address, but what goes upstream still appends the real peer.
    proxy = proxy_factory(fake_upstream.base_url)
    r = httpx.get(proxy.base_url + "/v1/models", headers={"x-forwarded-for": "198.51.100.7"},
                  timeout=10)
    assert r.status_code == 200
    seen = [s for s in fake_upstream.state.requests if s.path == "/v1/models"][-1]
    assert seen.headers["x-forwarded-for"] == "198.51.100.7, 127.0.0.1"
    # The beacon rate limit keys on the forwarded browser address.
    body = {"v": 1, "trace_id": None, "outcome": "ok", "t": {"start": 0, "end": 5}}
    assert httpx.post(proxy.base_url + "/v1/probe", json=body, timeout=10,
                      headers={"x-forwarded-for": "198.51.100.8"}).status_code == 202
    limiter = proxy.parts.obs.probe.limiter
    assert "198.51.100.8" in limiter._buckets and "127.0.0.1" not in limiter._buckets
