"""The OpenAI scanner's per-stream shortcuts (tracer/proxy/sse.py, "Cost"): after the first
output the rule runs only on what can change the record, and a content event of the shape the
upstream already sent is counted from its learnt prefix. They must read every stream as an
event-by-event reading with the rule does, however the bytes are cut."""
from __future__ import annotations

import json
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.proxy import sse as proxy_sse
from tracer.proxy.sse import SSEScanner, _data_of
from tracer.record.sse_vocabulary import DONE_DATA_BYTES


def event(obj: dict, *, spaced: bool = False) -> bytes:
    text = json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def chunk(delta: dict, finish_reason: str | None = None, *, id_: str = "c1") -> dict:
    return {"id": id_, "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def tool(index: int, name: str | None = None, arguments: str = "") -> dict:
    function = {"arguments": arguments} if name is None else {"name": name, "arguments": ""}
    return {"tool_calls": [{"index": index, "function": function}]}


class ParseEvery(SSEScanner):
    """The reference: every event parsed and judged by the rule, no shortcut."""

    __slots__ = ()

    def _event(self, event: bytes) -> int:
        data = _data_of(event)
        if data is None:
            return 0
        if data == DONE_DATA_BYTES:
            self.summary.done = True
            return 0
        if self._parse(data):
            self.summary.num_content_events += 1
            return 1
        return 0


def read(scanner: SSEScanner, reads: list[bytes]) -> tuple[list[int], list[tuple]]:
    counts, moments = [], []
    for part in reads:
        counts.append(scanner.feed(part))
        moments.append(tuple(scanner.take_moments()))
    return counts, moments


def counting_loads(monkeypatch) -> list[bytes]:
    parsed: list[bytes] = []

    def loads(data):
        parsed.append(data)
        return json.loads(data)
    monkeypatch.setattr(proxy_sse, "json", SimpleNamespace(loads=loads))
    return parsed


def test_a_thinking_stream_parses_its_first_reasoning_only(monkeypatch):
    parsed = counting_loads(monkeypatch)
    reads = [event(chunk({"role": "assistant", "content": ""})),
             *[event(chunk({"reasoning_content": f"step {i}"})) for i in range(20)],
             *[event(chunk({"content": f"word{i} "})) for i in range(5)],
             event(chunk(tool(0, "get_weather"))), event(chunk(tool(0, arguments="{}"))),
             event(chunk({}, "tool_calls")),
             event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 30}}),
             b"data: [DONE]\n\n"]
    expected = read(ParseEvery(), reads)
    parsed.clear()
    counts, moments = read(SSEScanner(), reads)
    assert (counts, moments) == expected and counts == [0] * 21 + [1] * 5 + [0] * 5
    assert [m for m in moments if m] == [(("output", "reasoning", None),),
                                        (("output", "tool_call", None),
                                         ("start", (0, 0), "get_weather")),
                                        (("ready", (0, 0), None),)]
    # The role and the first reasoning; the call's three events; the usage. Not the 19 other
    # thoughts, nor the text (the first is judged by the plain-content regex, the rest by
    # the prefix it taught).
    assert len(parsed) == 6 and not any(b"step 1" in p or b"word" in p for p in parsed)


def test_the_learnt_prefix_counts_content_and_leaves_the_summary_to_the_parse(monkeypatch):
    parsed = counting_loads(monkeypatch)
    scanner = SSEScanner()
    assert scanner.feed(event(chunk({"role": "assistant", "content": ""}))) == 0
    assert [scanner.feed(event(chunk({"content": f"t{i}"}))) for i in range(50)] == [1] * 50
    assert len(parsed) == 2                     # the role and the first content
    # The same prefix, but a finish reason, usage or a tool call in the rest: parsed.
    last = {**chunk({"content": "end"}, "length"), "usage": {"completion_tokens": 51}}
    assert scanner.feed(event(last)) == 1 and len(parsed) == 3
    assert scanner.summary.finish_reason == "length"
    assert scanner.summary.usage == {"completion_tokens": 51}
    # The same prefix with an empty string, words that look like a key, a line end inside:
    # read as before.
    assert scanner.feed(event(chunk({"content": ""}))) == 0
    assert scanner.feed(event(chunk({"content": 'say "usage":{ x'}))) == 1
    assert scanner.feed(b'data: {"id":"c1","object":"chat.completion.chunk","created":0,'
                        b'"model":"m","choices":[{"index":0,"delta":{"content":"a"\ndata: '
                        b'}}]}\n\n') == 1
    assert scanner.feed(b"data: [DONE]\n\n") == 0 and scanner.summary.done
    assert scanner.summary.num_content_events == 53


def test_an_upstream_whose_events_all_start_differently_stops_learning():
    reads = [event(chunk({"content": f"t{i}"}, id_=f"c{i}")) for i in range(40)]
    scanner = SSEScanner()
    assert read(scanner, reads)[0] == [1] * 40
    assert scanner._learns_left == 0 and scanner.summary.num_content_events == 40
    # A prefix that keeps matching keeps the budget; a new one (the next second's `created`)
    # is learnt again.
    scanner = SSEScanner()
    reads = [event({**chunk({"content": f"t{i}"}), "created": i // 10}) for i in range(100)]
    assert read(scanner, reads)[0] == [1] * 100
    assert scanner._learns_left == proxy_sse._MAX_LEARNS


def _segment(kind: str, i: int, spaced: bool, varying_id: bool) -> list[bytes]:
    id_ = f"c{i}" if varying_id else "c1"
    if kind == "reasoning":
        return [event(chunk({"reasoning_content": f"hm {i}"}, id_=id_), spaced=spaced)]
    if kind == "text":
        return [event(chunk({"content": f'w{i} \\"usage\\":{{'}, id_=id_), spaced=spaced)]
    if kind == "plain":   # the common event: its learnt prefix and suffix around plain text
        return [event(chunk({"content": f"p{i} "}, id_=id_), spaced=spaced)]
    if kind == "escapes":   # text ending in a backslash, an escaped line end, a quote
        text = [f"w{i}\\", f"a\nb{i}", f'q"{i}', f"u{i}\u00e9"][i % 4]
        return [event(chunk({"content": text}, id_=id_), spaced=spaced)]
    if kind == "other_suffix":   # the learnt prefix, another suffix (one more delta field)
        return [event(chunk({"content": f"t{i}", "refusal": None}, id_=id_), spaced=spaced)]
    if kind == "completion":
        return [event({"id": id_, "choices": [{"index": 0, "text": f"t{i}"}]}, spaced=spaced)]
    if kind == "second_choice":
        return [event({"id": id_, "choices": [{"index": 0, "delta": {}},
                                              {"index": 1, "delta": {"content": "x"}}]})]
    if kind == "lookalike":
        return [event(chunk({"reasoning_details": [{"type": "t", "text": "hidden"}]}, id_=id_))]
    if kind == "empty":
        return [event(chunk({"content": ""}, id_=id_), spaced=spaced)]
    if kind == "metrics":
        return [event({"choices": [], "metrics": {"arrival_time": 1.0}})]
    calls = [event(chunk(tool(i, f"fn{i}"), id_=id_)),          # a tool call
             event(chunk(tool(i, arguments='{"a":1}'), id_=id_))]
    # Made ready by a finish reason, so the next event finds no call open.
    return calls + [event(chunk({}, "tool_calls"))] if kind == "finished_tool" else calls


_THINKING = st.lists(st.sampled_from(["reasoning", "tool", "finished_tool"]), max_size=4)
_ANSWER = st.lists(st.sampled_from(["text", "text", "text", "plain", "plain", "escapes",
                                    "other_suffix", "completion", "second_choice",
                                    "lookalike", "empty", "metrics", "tool"]), max_size=14)


@settings(max_examples=150, deadline=None)
@given(_THINKING, _ANSWER, st.booleans(), st.booleans(), st.booleans(),
       st.lists(st.integers(min_value=1, max_value=4000), max_size=10))
def test_any_stream_and_any_cut_read_as_the_rule_reads_it(thinking, answer, spaced, varying_id,
                                                          finish_with_text, cuts):
    # Reasoning only before the first text: after it, neither reader reports a reasoning.
    parts = [event(chunk({"role": "assistant", "content": ""}))]
    for i, kind in enumerate(thinking + answer):
        parts += _segment(kind, i, spaced, varying_id)
    parts.append(event(chunk({"content": "end"} if finish_with_text else {}, "stop")))
    parts += [event({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 9}}),
              b"data: [DONE]\n\n"]
    raw = b"".join(parts)
    bounds = [0, *sorted({c % len(raw) for c in cuts} - {0}), len(raw)]
    for reads in (parts, [raw[a:b] for a, b in zip(bounds, bounds[1:])]):
        fast, slow = SSEScanner(), ParseEvery()
        assert read(fast, reads) == read(slow, reads)
        assert fast.summary == slow.summary


def test_the_learnt_suffix_leaves_only_the_text_to_scan(monkeypatch):
    """After the first plain content event, one of the same prefix and suffix around text
    with no quote or line end is counted without the pass over its rest (`_REST`); one
    whose text holds a quote, ends in a backslash or has another suffix takes that pass."""
    rest_calls = []

    class Rest:
        def fullmatch(self, *args):
            rest_calls.append(args[0])
            return proxy_sse._REST_PATTERN.fullmatch(*args)
    monkeypatch.setattr(proxy_sse, "_REST_PATTERN", proxy_sse._REST, raising=False)
    monkeypatch.setattr(proxy_sse, "_REST", Rest())
    scanner, reference = SSEScanner(), ParseEvery()
    reads = [event(chunk({"role": "assistant", "content": ""})),
             *(event(chunk({"content": f"t{i} \\n é"})) for i in range(20))]
    assert read(scanner, reads) == read(reference, reads)
    assert scanner._suffix == b'"},"finish_reason":null}]}'
    assert rest_calls == []
    # A quote in the text, a text ending in a backslash (an odd count would escape the
    # suffix's quote, so none is taken as closing there), another suffix.
    odd = [event(chunk({"content": 'say "hi"'})), event(chunk({"content": "a\\"})),
           event(chunk({"content": "x", "refusal": None}))]
    assert read(scanner, odd) == read(reference, odd)
    assert len(rest_calls) == 3
    assert scanner.summary == reference.summary
