"""The side-reader of relayed SSE: what counts as the first token, however the bytes are cut."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.proxy.sse import SSEScanner
from tracer.proxy.stream_summary import summarize_body, token_counts


def event(obj: dict, *, spaced: bool = False) -> bytes:
    text = json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def chat(delta: dict, finish_reason: str | None = None) -> dict:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


# llama-cpp-python's shape: json.dumps with spaces, a role-only delta before the content.
LLAMA_CPP_STREAM = b"".join([
    event(chat({"role": "assistant"}), spaced=True),
    event(chat({"content": "The"}), spaced=True),
    event(chat({"content": " capital"}), spaced=True),
    event(chat({"content": ""}), spaced=True),
    event({**chat({}, "stop"), "timings": {"prompt_n": 12, "cache_n": 3, "prompt_ms": 40.5,
                                           "predicted_n": 2, "predicted_ms": 30.0}}, spaced=True),
    b"data: [DONE]\n\n",
])


def test_role_only_and_empty_deltas_are_not_tokens():
    # vLLM's shape (#15106): the role with an empty content, before the first token.
    vllm_like = SSEScanner()
    assert vllm_like.feed(event(chat({"role": "assistant", "content": ""}))) == 0
    assert vllm_like.feed(event({"choices": [{"index": 0, "text": ""}]})) == 0
    assert vllm_like.feed(event(chat({"content": "Hi"}))) == 1
    scanner = SSEScanner()
    assert scanner.feed(LLAMA_CPP_STREAM) == 2
    summary = scanner.summary
    assert summary.done and summary.finish_reason == "stop"
    assert summary.timings["prompt_ms"] == 40.5
    assert token_counts(summary) == (15, 3, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(LLAMA_CPP_STREAM) - 1), max_size=12))
def test_any_chunking_gives_the_same_reading(cuts):
    bounds = [0, *sorted(set(cuts)), len(LLAMA_CPP_STREAM)]
    scanner = SSEScanner()
    per_chunk = [scanner.feed(LLAMA_CPP_STREAM[a:b]) for a, b in zip(bounds, bounds[1:])]
    assert sum(per_chunk) == 2 and scanner.summary.done and not scanner.pending
    assert scanner.summary.timings["predicted_n"] == 2
    # The first token is reported by the chunk that completes the first content event.
    first_content_end = LLAMA_CPP_STREAM.index(b'"The"') + len(b'"The"}, "finish_reason": null}]}\n\n')
    first_chunk = next(i for i, n in enumerate(per_chunk) if n)
    assert bounds[first_chunk] < first_content_end <= bounds[first_chunk + 1]


def test_crlf_multiline_data_comments_and_completions():
    scanner = SSEScanner()
    assert scanner.feed(b": keep-alive\r\n\r\n") == 0
    # A CR ends its line at once (SSE: CRLF, LF or CR), so the blank line is complete before
    # its LF comes; that LF, in the next read, is the rest of the CRLF, not another line.
    assert scanner.feed(b'data: {"choices":[{"text":\r\ndata: "Hi"}]}\r\n\r') == 1
    assert not scanner.pending
    assert scanner.feed(b"\n") == 0 and not scanner.pending
    assert scanner.feed(b'data: {"choices":[{"text":"again"}]}\r\r') == 1


def test_lookalikes_are_not_content():
    scanner = SSEScanner()
    assert scanner.feed(event(chat({"content": "first"}))) == 1
    lookalikes = [chat({"reasoning_content": "thinking"}),
                  chat({"tool_calls": [{"function": {"arguments": '{"content":"x"}'}}]}),
                  chat({"content": None}), {"choices": [], "usage": {"prompt_tokens": 7,
                                                                     "completion_tokens": 1}}]
    assert [scanner.feed(event(obj)) for obj in lookalikes] == [0, 0, 0, 0]
    assert scanner.summary.usage["prompt_tokens"] == 7
    assert token_counts(scanner.summary) == (7, 0, 1)


def test_an_error_event_and_an_endless_event_are_handled():
    scanner = SSEScanner(max_event_bytes=64)
    assert scanner.feed(event({"error": {"message": "boom"}})) == 0
    assert scanner.summary.error == {"message": "boom"}
    assert scanner.feed(b"data: " + b"x" * 100) == 0
    assert not scanner.pending                            # dropped: bounded memory
    assert scanner.feed(b"x" * 100 + b"\n") == 0
    # The over-long event ends at the next blank line; reading resumes after it.
    assert scanner.feed(b"\n" + event(chat({"content": "late"}))) == 1


def test_a_whole_body_is_summarized():
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Paris."},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                                 "prompt_tokens_details": {"cached_tokens": 4}}}).encode()
    summary, has_content, _ = summarize_body(body)
    assert has_content and summary.finish_reason == "length"
    assert token_counts(summary) == (9, 4, 3)
    assert summarize_body(b"not json")[1] is False
