"""Stream readers outside the proxy meet the same hostile event (issue 39, break 9): JSON
nested past the interpreter's stack. The probe's reader (`ContentStream`) counts it as an
unreadable event and reads on; the load generator fails that request as an invalid response
instead of raising out of its run."""
from __future__ import annotations

import json

import pytest

from tracer.bench.stream import StreamTimeline
from tracer.record.content_stream import ContentStream
from tracer.record.first_content import CONTENT

DEEP = '{"a":' * 5_000 + "1" + "}" * 5_000


def _sse(*data: str) -> bytes:
    return "".join(f"data: {d}\n\n" for d in data).encode()


@pytest.mark.parametrize("first", ['{"type":"message_start","message":{}}', None])
def test_the_probe_reader_skips_a_deep_event(first):
    text = '{"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}'
    stream = ContentStream("text/event-stream")
    kinds = stream.feed(_sse(*[d for d in (first, DEEP, text) if d]))
    assert kinds[-1] == CONTENT and stream.format == "anthropic" and stream.errors == 1


def test_the_probe_reader_skips_a_deep_ndjson_line_and_body():
    ndjson = ContentStream("application/x-ndjson")
    assert ndjson.feed((DEEP + '\n{"message":{"content":"Hi"},"done":false}\n').encode())[-1] \
        == CONTENT
    body = ContentStream("application/json")
    body.feed(DEEP.encode())
    assert body.close() == [0] and body.errors == 1


@pytest.mark.parametrize("payload", [DEEP, '{"x":' + "1" * 5_000 + "}"])
def test_the_load_generator_fails_the_request_it_cannot_read(payload):
    timeline = StreamTimeline(0, "chat")
    timeline.mark_sent()
    timeline.feed_data(json.dumps({"choices": [{"delta": {"content": "Hi"}}]}))
    timeline.feed_data(payload)   # raised RecursionError / ValueError out of the run
    result = timeline.finish()
    assert result.error_kind == "invalid_response"
