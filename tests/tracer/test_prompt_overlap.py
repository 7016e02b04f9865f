"""The prompt overlap behind the prefix-cache-miss verdict (tracer/record/prompt_overlap.py):
what it reads of a request, what it keeps, and that a hostile request costs it nothing."""
from __future__ import annotations

import json

from tracer.proxy.serving import peek_request
from tracer.record.prompt_overlap import (
    MAX_PIECES,
    MAX_PROMPT_SOURCE_BYTES,
    RecentPrompts,
    fingerprint,
    prompt_text,
)

SYSTEM = "\n".join(f"Rule {i}: answer politely and in full sentences." for i in range(40))


def test_a_change_of_length_on_the_first_line_leaves_the_rest_shared():
    recent = RecentPrompts()
    recent.add("a" * 32, fingerprint(f"Now: 5:01\n{SYSTEM}"))
    overlap = recent.best_overlap(fingerprint(f"Now: 2026-12-03T05:01:00.123Z\n{SYSTEM}"))
    assert overlap.trace_id == "a" * 32 and overlap.shared_fraction > 0.95


def test_the_newest_holder_of_the_most_text_wins():
    recent = RecentPrompts()
    recent.add("a" * 32, fingerprint(SYSTEM))
    recent.add("b" * 32, fingerprint(SYSTEM + "\nA longer tail that only b holds."))
    assert recent.best_overlap(fingerprint(SYSTEM)).trace_id == "b" * 32
    assert recent.best_overlap(fingerprint("nothing in common here at all")) is None


def test_memory_is_bounded_by_pieces():
    recent = RecentPrompts(max_pieces=100)
    for i in range(50):
        recent.add(f"{i:032x}", fingerprint("\n".join(f"line {i} {j} of text" for j in range(10))))
        assert len(recent._newest) <= 100
    # The newest prompt is still found whole; the oldest is forgotten.
    newest = fingerprint("\n".join(f"line 49 {j} of text" for j in range(10)))
    assert recent.best_overlap(newest).shared_fraction > 0.9   # all but the line breaks
    oldest = fingerprint("\n".join(f"line 0 {j} of text" for j in range(10)))
    assert recent.best_overlap(oldest) is None
    huge = fingerprint("\n".join(f"distinct line number {j}" for j in range(10 * MAX_PIECES)))
    assert len(huge.pieces) == MAX_PIECES


def test_what_a_request_carries_is_read_and_anything_else_is_not():
    chat = peek_request(json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]}]}).encode())
    assert prompt_text(chat.prompt) == "sys\nhi"
    anthropic = peek_request(b'{"model": "m", "system": "be brief", "messages": []}')
    assert prompt_text(anthropic.prompt) == "be brief"
    # Hostile shapes: numbers, nesting past the depth bound, objects without text.
    nested = {"content": "deep"}
    for _ in range(50):
        nested = {"content": [nested]}
    assert prompt_text([1, 2.5, None, True, {"role": "user"}, nested]) == ""
    # A body over the bound is not handed to the diagnosis at all.
    big = json.dumps({"model": "m", "prompt": "x" * MAX_PROMPT_SOURCE_BYTES}).encode()
    assert peek_request(big).prompt is None


def test_the_proxy_holds_the_raw_body_not_its_parsed_objects():
    # Empty text parts: ~10x larger parsed than raw. A parked record holds only the bytes.
    body = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": ""}] * 2000}]}).encode()
    fields = peek_request(body)
    assert fields.prompt is body
    assert prompt_text(fields.prompt) == "\n" * 1999
    assert prompt_text(b"[1, 2]") == "" and prompt_text(b"{not json") == ""
    assert prompt_text(b"[" * 100_000 + b"]" * 100_000) == ""
