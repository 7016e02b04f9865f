"""The beacon's tool calls (issue 37): `t.first_tool_call` and the bounded `tool_calls` list,
as tracer/web/probe/beacon.py checks them and ingest keeps them on the joined record's
`client`; frontend_probe/formats.js sends them (frontend_probe/README.md, "The beacon")."""
from __future__ import annotations

import json

import pytest

from tracer.record.request_record import RequestRecord
from tracer.sinks.store import TraceStore
from tracer.web.probe.beacon_error import BeaconError
from tracer.web.probe.beacon_fields import MAX_TOOL_CALLS
from tracer.web.probe.ingest import ProbeIngestor
from tracer.web.probe.schema import parse_beacon

TRACE = "cd" * 16


def beacon(**extra) -> dict:
    t = {"start": 0, "headers": 40, "first_byte": 41, "first_token": None, "end": 90}
    t.update(extra.pop("t", {}))
    return {"v": 1, "trace_id": TRACE, "outcome": "ok", "t": t, **extra}


def parse(obj: dict):
    return parse_beacon(json.dumps(obj).encode())


def refused(obj: dict) -> tuple[int, str | None, str]:
    with pytest.raises(BeaconError) as err:
        parse(obj)
    return err.value.status, err.value.param, err.value.message


CALLS = [{"name": "get_weather", "start": 48, "ready": 60},
         {"name": "get_time", "start": 60, "ready": None}]


def test_first_tool_call_and_the_calls_are_kept():
    b = parse(beacon(t={"first_tool_call": 48}, tool_calls=CALLS))
    assert b.t.first_tool_call == 48 and b.t.as_dict()["first_tool_call"] == 48
    assert b.as_dict()["tool_calls"] == [{"name": "get_weather", "start": 48.0, "ready": 60.0},
                                         {"name": "get_time", "start": 60.0, "ready": None}]
    assert b.t.first_output() == (48, "tool_call")
    # absent, null or empty: no calls; an older probe sends neither field
    for absent in ({}, {"tool_calls": None}, {"tool_calls": []}):
        b = parse(beacon(**absent))
        assert b.tool_calls == () and b.as_dict()["tool_calls"] == []
        assert b.t.first_tool_call is None


def test_the_first_output_is_the_earliest_kind_by_the_server_s_rule():
    # tracer/record/output_segments.py, `by_arrival`: in a tie the text came after the thinking
    # or the call, and a model thinks before it calls
    times = {"first_token": 70, "first_reasoning": 45, "first_tool_call": 50}
    assert parse(beacon(t=times)).t.first_output() == (45, "reasoning")
    assert parse(beacon(t={**times, "first_token": 45})).t.first_output() == (45, "reasoning")
    assert parse(beacon(t={"first_token": 45, "first_tool_call": 45})).t.first_output() == (
        45, "tool_call")
    assert parse(beacon(t={"first_tool_call": 45, "first_reasoning": 45})).t.first_output() == (
        45, "reasoning")
    assert parse(beacon()).t.first_output() == (None, None)


def test_unknown_fields_of_a_call_are_dropped_and_an_odd_name_is_none():
    """Never arguments: whatever else a call carries is not kept; a name off the APIs'
    charset (a page's business) keeps its times without its text."""
    b = parse(beacon(tool_calls=[{"name": "f", "start": 50, "arguments": "{\"secret\": 1}"},
                                 {"name": "<img src=x>", "start": 51},
                                 {"name": "é" * 10, "start": 52}, {"start": 53}]))
    assert [c.as_dict() for c in b.tool_calls] == [
        {"name": "f", "start": 50.0, "ready": None}, {"name": None, "start": 51.0, "ready": None},
        {"name": None, "start": 52.0, "ready": None}, {"name": None, "start": 53.0, "ready": None}]
    assert "secret" not in json.dumps(b.as_dict())


@pytest.mark.parametrize("value", [40.5, 91, -1, 3_600_001, "50", True, [50]])
def test_first_tool_call_outside_first_byte_to_end_or_not_a_number_is_422(value):
    status, param, _ = refused(beacon(t={"first_tool_call": value}))
    assert (status, param) == (422, "t.first_tool_call")


@pytest.mark.parametrize("calls, param, message", [
    ([{"name": "f", "start": 50}] * (MAX_TOOL_CALLS + 1), "tool_calls",
     f"tool_calls must be a list of at most {MAX_TOOL_CALLS} tool calls {{name, start, ready}}, "
     "in start order, within t"),
    ({"name": "f", "start": 50}, "tool_calls", None),
    ("get_weather", "tool_calls", None),
    ([{"name": "f" * 65, "start": 50}], "tool_calls[0].name",
     "tool_calls[0].name must be a string of at most 64 characters"),
    ([{"name": 7, "start": 50}], "tool_calls[0].name", None),
    ([{"name": ["f"], "start": 50}], "tool_calls[0].name", None),
    ([{"name": "f"}], "tool_calls[0].start", "tool_calls[0].start must be a number of ms"),
    ([{"name": "f", "start": "50"}], "tool_calls[0].start", None),
    ([{"name": "f", "start": True}], "tool_calls[0].start", None),
    ([{"name": "f", "start": 50, "ready": -1}], "tool_calls[0].ready", None),
    ([{"name": "f", "start": 50, "ready": 49}], "tool_calls",
     "a tool call's ready must not be before its start"),
    ([{"name": "f", "start": 50}, {"name": "g", "start": 49}], "tool_calls",
     "tool_calls must be in start order"),
    ([{"name": "f", "start": 30}], "tool_calls",
     "tool_calls must lie between the response's first byte and t.end"),
    ([{"name": "f", "start": 50, "ready": 91}], "tool_calls", None),
    ([["f", 50, 60]], "tool_calls[0]", None),
])
def test_a_malformed_tool_call_list_is_422_naming_the_field(calls, param, message):
    status, got_param, got_message = refused(beacon(tool_calls=calls))
    assert (status, got_param) == (422, param)
    if message is not None:
        assert got_message == message
    # a fixed message: the page's strings are never echoed
    assert "ffff" not in got_message and "get_weather" not in got_message


def test_a_huge_or_deep_tool_call_list_is_refused_not_kept():
    huge = [{"name": "f", "start": 50, "ready": 60, "arguments": "x" * 1_000}] * 1_000
    assert refused(beacon(tool_calls=huge))[:2] == (422, "tool_calls")
    deep = b'{"v":1,"outcome":"ok","t":{"start":0,"end":9},"tool_calls":' + b"[" * 100_000
    with pytest.raises(BeaconError) as err:
        parse_beacon(deep + b"]" * 100_000 + b"}")
    assert err.value.status in (400, 422)


def test_ingest_keeps_them_on_the_joined_record_s_client():
    store = TraceStore(capacity=4)
    store.put(RequestRecord("chatcmpl-t", TRACE, "ef" * 8, "m", "chat", 10**9, 10**9 + 90 * 10**6,
                            ttft_ns=None))
    b = parse(beacon(t={"first_reasoning": 45, "first_tool_call": 48}, tool_calls=CALLS))
    assert ProbeIngestor(store=store).ingest(b) == "accepted"
    client = store.get(TRACE).client
    assert client["first_tool_call_ms"] == 48 == client["t"]["first_tool_call"]
    assert (client["first_output_ms"], client["first_output_kind"]) == (45, "reasoning")
    assert client["tool_calls"] == [{"name": "get_weather", "start": 48.0, "ready": 60.0},
                                    {"name": "get_time", "start": 60.0, "ready": None}]
    assert client["client_ttft_ms"] is None    # a tool-call-only answer has no first text
