"""The beacon's pydantic model (tracer/web/probe/beacon.py) against the hand-written validator
it stands for: over generated beacons both accept and refuse the same bodies, with the same
status, the same checked values and, for a refusal, the same `param`; and the JSON Schema
/openapi.json shows is the model's own.

`_reference` below is the hand-written check kept as the differential's oracle only."""
from __future__ import annotations

import json
import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracer.record.emits import MAX_SEND_TIMES
from tracer.record.first_content import FORMATS
from tracer.record.traceparent import is_trace_id, parse_traceparent
from tracer.web.probe.beacon_error import BeaconError
from tracer.web.probe.beacon_fields import MAX_COUNT, MAX_MILESTONE_MS, MAX_MS, OUTCOMES
from tracer.web.probe.endpoint import _OPENAPI
from tracer.web.probe.schema import beacon_json_schema, parse_beacon


class _Refused(Exception):
    def __init__(self, status: int, param: str | None = None) -> None:
        self.status, self.param = status, param


def _const(name):
    raise _Refused(422)


def _reference(body: bytes) -> dict:
    """The hand-written validator's verdict: the checked beacon as a dict, or _Refused."""
    try:
        obj = json.loads(body.decode("utf-8"), parse_constant=_const)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _Refused(400) from None
    except ValueError:
        raise _Refused(400) from None
    if not isinstance(obj, dict):
        raise _Refused(422)
    if obj.get("v") != 1 or isinstance(obj.get("v"), bool):
        raise _Refused(422, "v")
    tid = obj.get("trace_id")
    if tid is not None and (not isinstance(tid, str) or not is_trace_id(tid)):
        raise _Refused(422, "trace_id")
    if obj.get("outcome") not in OUTCOMES:
        raise _Refused(422, "outcome")
    chunks = _count(obj, "chunks")
    t = _times(obj.get("t"))
    tp = parse_traceparent(_string(obj, "traceparent", r".*", 256))
    status = obj.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)
                               or not 100 <= status <= 599):
        raise _Refused(422, "status")
    out = {"trace_id": tid, "outcome": obj["outcome"], "t": t,
           "traceparent": None if tp is None else str(tp), "status": status,
           "url_path": _string(obj, "url_path", r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,255}", 2048),
           "chunks": chunks, "itl_ms": _itl(obj.get("itl_ms")),
           "resource": _numbers(obj.get("resource"), ("dns_ms", "connect_ms", "tls_ms",
                                                      "request_ms", "response_ms"), "resource"),
           "probe_errors": _count(obj, "probe_errors"),
           "sdk": _string(obj, "sdk", r"[A-Za-z0-9._@/+ -]{1,64}", 256),
           "model": _string(obj, "model", r"[A-Za-z0-9._:/@+-]{1,128}", 256),
           "input_ms": _ms(obj.get("input_ms"), "input_ms")}
    out["chunk_ms"] = _chunk_times(obj.get("chunk_ms"), chunks)
    out["token"] = _string(obj, "token", r"[0-9a-f]{64}", 128)
    server = obj.get("server")
    if server is not None and (not isinstance(server, str) or len(server) > 2048 or not
                               re.fullmatch(r"[A-Za-z0-9_-]{1,2000}\.[A-Za-z0-9_-]{43}", server)):
        raise _Refused(422, "server")
    fmt = obj.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt not in FORMATS):
        raise _Refused(422, "format")
    return {**out, "server": server, "format": fmt, "tool_calls": _tool_calls(obj, t)}


def _tool_calls(obj, t):
    calls = obj.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list) or len(calls) > 8:
        raise _Refused(422, "tool_calls")
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise _Refused(422, f"tool_calls[{i}]")
        name = call.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 64):
            raise _Refused(422, f"tool_calls[{i}].name")
        name = name if name and re.fullmatch(r"[A-Za-z0-9_.:/@+-]{1,64}", name) else None
        start = _ms(call.get("start"), f"tool_calls[{i}].start", True)
        ready = _ms(call.get("ready"), f"tool_calls[{i}].ready")
        for value, part in ((start, "start"), (ready, "ready")):
            if value is not None and value > MAX_MILESTONE_MS:
                raise _Refused(422, f"tool_calls[{i}].{part}")
        if ready is not None and ready < start:
            raise _Refused(422, "tool_calls")
        out.append({"name": name, "start": start, "ready": ready})
    if any(b["start"] < a["start"] for a, b in zip(out, out[1:])):
        raise _Refused(422, "tool_calls")
    low = max(t["headers"] or 0.0, t["first_byte"] or 0.0)
    if not all(low <= c["start"] <= t["end"] and (c["ready"] is None or c["ready"] <= t["end"])
               for c in out):
        raise _Refused(422, "tool_calls")
    return out


def _ms(value, param, required=False):
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Refused(422, param)
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or not 0.0 <= value <= MAX_MS:
        raise _Refused(422, param)
    return value


def _times(t):
    names = ("start", "headers", "first_byte", "first_token", "first_paint", "end",
             "first_reasoning", "first_tool_call")
    if not isinstance(t, dict):
        raise _Refused(422, "t")
    v = {n: _ms(t.get(n), f"t.{n}", n in ("start", "end")) for n in names}
    if v["start"] != 0.0:
        raise _Refused(422, "t.start")
    for n in ("headers", "first_byte", "first_token", "first_paint", "first_reasoning",
              "first_tool_call"):
        if v[n] is not None and v[n] > MAX_MILESTONE_MS:
            raise _Refused(422, f"t.{n}")
    order = [n for n in ("start", "headers", "first_byte", "first_token") if v[n] is not None]
    for a, b in zip(order, order[1:]):
        if v[b] < v[a]:
            raise _Refused(422, f"t.{b}")
    if v["end"] < v[order[-1]]:
        raise _Refused(422, "t.end")
    for n in ("first_reasoning", "first_tool_call"):
        r = v[n]
        if r is not None and not max(v["headers"] or 0.0, v["first_byte"] or 0.0) <= r <= v["end"]:
            raise _Refused(422, f"t.{n}")
    if v["first_paint"] is not None and (v["first_token"] is None
                                         or v["first_paint"] < v["first_token"]):
        raise _Refused(422, "t.first_paint")
    return v


def _string(obj, name, pattern, max_chars):
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        raise _Refused(422, name)
    return value if re.fullmatch(pattern, value, re.DOTALL) else None


def _count(obj, name, param=None):
    value = obj.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise _Refused(422, param or name)
    return value


def _numbers(value, fields, param):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Refused(422, param)
    return {n: _ms(value.get(n), f"{param}.{n}", True) for n in fields}


def _itl(value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Refused(422, "itl_ms")
    stats = _numbers(value, ("mean", "p50", "p95", "max"), "itl_ms")
    return {"count": _count(value, "count", "itl_ms.count"), **stats}


def _chunk_times(value, chunks):
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > min(MAX_SEND_TIMES, chunks):
        raise _Refused(422, "chunk_ms")
    times = [_ms(x, f"chunk_ms[{i}]", True) for i, x in enumerate(value)]
    if any(b < a for a, b in zip(times, times[1:])):
        raise _Refused(422, "chunk_ms")
    return times


# Values at and around every bound, of every JSON type, plus the valid shapes.
_EDGE_NUMBERS = st.sampled_from([0, -0.0, 1, 1.5, -1, 99, 100, 599, 600, MAX_COUNT,
                                 MAX_COUNT + 1, MAX_MILESTONE_MS, MAX_MILESTONE_MS + 1, MAX_MS,
                                 MAX_MS + 0.5, 10**400, 1e300])
_TOKEN_LIKE = st.sampled_from(["ab" * 16, "0" * 32, "AB" * 16, "ab" * 32, "x" * 129, "",
                               "/v1/chat", "a b", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
                               "A" * 10 + "." + "B" * 43, "A.B", "A" * 2001 + "." + "B" * 43,
                               *OUTCOMES, *FORMATS, "ttftscope-probe/0.1.0", "é" * 300])
_SCALAR = st.one_of(st.none(), st.booleans(), _EDGE_NUMBERS, _TOKEN_LIKE,
                    st.floats(0, 5e6, allow_nan=False), st.integers(-5, 40), st.text(max_size=8))
_JUNK = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.dictionaries(st.text(max_size=3),
                                                                            _SCALAR, max_size=2))
_MS_ISH = st.one_of(st.floats(0, 2000, allow_nan=False), st.integers(0, 2000), _EDGE_NUMBERS,
                    st.none(), _JUNK)


@st.composite
def _beacons(draw) -> dict:
    times = sorted(draw(st.lists(st.floats(0, 2000, allow_nan=False), min_size=7, max_size=7)))
    names = ("headers", "first_byte", "first_token", "first_paint", "first_reasoning",
             "first_tool_call", "end")
    t = {"start": draw(st.sampled_from([0] * 8 + [0.0, -0.0, 1, None, True]))}
    for name, value in zip(names, times):
        if draw(st.integers(0, 7)):   # mostly the plausible, ordered value
            t[name] = value
        elif draw(st.booleans()):
            t[name] = draw(_MS_ISH)
    ms = st.floats(0, 50, allow_nan=False)
    valid = {   # a plausible value of each field; one in twelve is replaced by anything
        "v": st.just(1), "trace_id": st.sampled_from(["ab" * 16, None]),
        "outcome": st.sampled_from(OUTCOMES), "t": st.just(t), "chunks": st.integers(0, 40),
        "chunk_ms": st.lists(ms, max_size=36).map(sorted),
        "itl_ms": st.fixed_dictionaries({k: ms for k in ("mean", "p50", "p95", "max")},
                                        optional={"count": st.integers(0, 9)}),
        "resource": st.fixed_dictionaries({k: ms for k in ("dns_ms", "connect_ms", "tls_ms",
                                                           "request_ms", "response_ms")}),
        "format": st.sampled_from(FORMATS), "status": st.sampled_from([99, 100, 204, 599, 600]),
        "traceparent": st.sampled_from(["00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "junk"]),
        "url_path": st.sampled_from(["/v1/chat/completions", "no slash"]),
        "probe_errors": st.sampled_from([0, 3, MAX_COUNT, MAX_COUNT + 1]), "input_ms": ms,
        "sdk": st.sampled_from(["ttftscope-probe/0.1.0", "b\nad"]),
        "model": st.sampled_from(["smollm2", "a model"]),
        "token": st.sampled_from(["ab" * 32, "AB" * 32]),
        "server": st.just("A" * 10 + "." + "B" * 43),
        "tool_calls": st.lists(st.fixed_dictionaries(
            {"start": st.sampled_from([t.get("first_byte"), t.get("end"), 500.0, 1e9])},
            optional={"name": st.sampled_from(["get_weather", "a b", "f" * 65, 7]),
                      "ready": st.one_of(st.none(), st.sampled_from([t.get("end"), 0.0, 600.0])),
                      "arguments": st.just("{}")}), max_size=9)}
    mandatory = {"v", "outcome", "t"}
    out = {}
    for name, strategy in valid.items():
        if name in mandatory and draw(st.integers(0, 30)) or draw(st.integers(0, 2)) == 0:
            out[name] = draw(_JUNK if draw(st.integers(0, 11)) == 0 else strategy)
    return out


def _verdict(parse, body: bytes):
    try:
        return ("ok", parse(body))
    except (_Refused, BeaconError) as exc:
        return ("refused", exc.status, exc.param)


def _new(body: bytes) -> dict:
    beacon = parse_beacon(body)
    return {**beacon.as_dict(), "chunk_ms": list(beacon.chunk_ms), "token": beacon.token,
            "server": beacon.server}


@settings(max_examples=1500, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(_beacons())
def test_the_model_accepts_and_refuses_what_the_hand_written_validator_did(obj):
    body = json.dumps(obj).encode()
    old, new = _verdict(_reference, body), _verdict(_new, body)
    if old[0] == "ok" or new[0] == "ok":
        assert new == old
        return
    assert new[1] == old[1], (old, new)
    # With several faults inside `t` the two may name different ones of them: the model
    # checks each time's own bound (start = 0, a milestone's hour) with its type.
    if not (str(old[2]).startswith("t.") and str(new[2]).startswith("t.")):
        assert new[2] == old[2], (old, new)


def test_bodies_that_are_not_json_objects_keep_their_status():
    for body, status in ((b"\xff{}", 400), (b"{", 400), (b"[1]", 422), (b'{"v": NaN}', 422),
                         (b'{"v":1,"x":' + b"9" * 5000 + b"}", 400), (b"[" * 100_000, 400)):
        assert _verdict(_new, body)[:2] == ("refused", status) == _verdict(_reference, body)[:2]


def test_messages_name_the_field_and_its_rule():
    base = {"v": 1, "outcome": "ok", "t": {"start": 0, "end": 9}}
    cases = [({**base, "outcome": "meh"}, f"outcome must be one of {', '.join(OUTCOMES)}"),
             ({**base, "t": {"start": 0}}, "t.end must be a number of ms"),
             ({**base, "chunks": -1}, f"chunks must be an integer in [0, {MAX_COUNT}]"),
             ({**base, "resource": 3}, "resource must be an object or null"),
             ({**base, "chunk_ms": [1]}, f"chunk_ms must be a list of at most {MAX_SEND_TIMES} "
                                         "times, no more than chunks"),
             ({**base, "chunks": 2, "chunk_ms": [1, "x"]}, "chunk_ms[1] must be a number of ms"),
             ({**base, "t": {"start": 0, "headers": 5, "first_byte": 4, "end": 9}},
              "t.first_byte is earlier than t.headers")]
    for obj, message in cases:
        verdict = _verdict(lambda b: parse_beacon(b), json.dumps(obj).encode())
        try:
            parse_beacon(json.dumps(obj).encode())
        except BeaconError as exc:
            assert (exc.status, exc.message) == (422, message), verdict
        else:
            raise AssertionError(f"accepted {obj}")


def test_openapi_shows_the_models_own_schema():
    schema = beacon_json_schema()
    body = _OPENAPI["requestBody"]["content"]
    assert body["application/json"]["schema"] == body["text/plain"]["schema"] == schema
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    props = schema["properties"]
    assert props["chunk_ms"]["anyOf"][0]["maxItems"] == MAX_SEND_TIMES
    assert props["t"]["properties"]["headers"]["anyOf"][0]["maximum"] == MAX_MILESTONE_MS
    assert props["t"]["properties"]["end"]["maximum"] == MAX_MS
    assert set(schema["required"]) == {"v", "outcome", "t"}
