"""The prompt overlap behind the prefix-cache-miss verdict (tracer/record/prompt_overlap.py):
what it reads of a request, what it keeps, and that a hostile request costs it nothing."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.proxy.serving import peek_request
from tracer.record.prompt_overlap import (
    MAX_PIECES,
    MAX_PROMPT_SOURCE_BYTES,
    FingerprintCache,
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


# The cache against the long way: any prompt, any parts, long and short, repeated or not,
# with the piece cap inside a part, between parts, or never reached.
_LINES = st.one_of(st.sampled_from(["", "}", "You are helpful.", "Rule 1: be brief.", "x" * 300,
                                    "Now: 05:00:01", "é" * 40]),
                   st.text(max_size=40))
_PARTS = st.lists(st.lists(_LINES, max_size=60).map("\n".join), max_size=6)


@settings(max_examples=300, deadline=None)
@given(prompts=st.lists(_PARTS, min_size=1, max_size=4), max_pieces=st.sampled_from([8, 1 << 14]))
def test_the_fingerprint_cache_gives_the_long_ways_fingerprint(prompts, max_pieces):
    cache = FingerprintCache(max_pieces=max_pieces)
    for parts in prompts + prompts:             # the second time, long parts come from the cache
        source = [{"role": "user", "content": p} for p in parts]
        assert cache.of(source) == fingerprint(prompt_text(source))


def test_the_fingerprint_cache_at_the_piece_cap_and_keeps_no_text():
    distinct = "\n".join(f"line number {i} of a very long prompt" for i in range(MAX_PIECES + 50))
    source = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": distinct}]
    cache = FingerprintCache()
    assert cache.of(source) == fingerprint(prompt_text(source))
    assert len(cache.of(source).pieces) == MAX_PIECES
    kept = [k for entry in cache._parts.items() for k in entry]
    assert not any(isinstance(v, str) for v in kept)           # hashes and lengths only
    assert all(isinstance(k, tuple) and all(isinstance(x, int) for x in k) for k in cache._parts)
