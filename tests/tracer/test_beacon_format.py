"""The beacon's `format` (a closed set) and `t.first_reasoning`, as tracer/web/probe/beacon.py
and client_times.py check them, on the beacons the real probe sends (frontend_probe/probe.js,
formats.js)."""
from __future__ import annotations

import json

import pytest

from tracer.record.first_content import FORMATS
from tracer.web.probe.beacon_error import BeaconError
from tracer.web.probe.schema import parse_beacon

TRACE = "ab" * 16


def beacon(**extra) -> dict:
    t = {"start": 0, "headers": 40, "first_byte": 41, "first_token": 55, "end": 90}
    t.update(extra.pop("t", {}))
    return {"v": 1, "trace_id": TRACE, "outcome": "ok", "t": t, **extra}


def parse(obj: dict):
    return parse_beacon(json.dumps(obj).encode())


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_of_the_closed_set_is_kept(fmt):
    assert parse(beacon(format=fmt)).format == fmt
    assert parse(beacon(format=fmt)).as_dict()["format"] == fmt


def test_null_or_absent_format_is_none():
    assert parse(beacon(format=None)).format is None
    assert parse(beacon()).format is None


@pytest.mark.parametrize("bad", ["claude", "OpenAI", "", "openai ", 1, True, ["openai"], {"f": 1},
                                 "x" * 10_000])
def test_any_other_format_is_422_naming_the_field(bad):
    with pytest.raises(BeaconError) as err:
        parse(beacon(format=bad))
    assert err.value.status == 422 and err.value.param == "format"
    # a fixed message: the page's string is never echoed
    assert err.value.message == f"format must be one of {', '.join(FORMATS)} or null"


def test_first_reasoning_is_kept_apart_from_first_token():
    b = parse(beacon(t={"first_reasoning": 48.5}))
    assert b.t.first_reasoning == 48.5 and b.t.first_token == 55
    assert b.t.as_dict()["first_reasoning"] == 48.5
    # reasoning may come after the first token too (an interleaved stream), or alone
    assert parse(beacon(t={"first_reasoning": 80})).t.first_reasoning == 80
    assert parse(beacon(t={"first_token": None, "first_reasoning": 60})).t.first_reasoning == 60
    assert parse(beacon()).t.first_reasoning is None


@pytest.mark.parametrize("value", [40.5, 91, -1, 3_600_001, "50", True])
def test_first_reasoning_outside_first_byte_to_end_or_not_a_number_is_422(value):
    with pytest.raises(BeaconError) as err:
        parse(beacon(t={"first_reasoning": value}))
    assert err.value.status == 422 and err.value.param == "t.first_reasoning"
