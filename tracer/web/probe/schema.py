"""A beacon body in, a checked `Beacon` or a `BeaconError` out; and the beacon's JSON Schema.

Both read the one statement of the schema, the pydantic model `Beacon`
(`tracer/web/probe/beacon.py`): /openapi.json shows the JSON Schema it writes
(`beacon_json_schema`), so the document cannot drift from the check, and each field's
`description` in it is also its rule in the 422's message (`<param> must be <description>`).
"""
from __future__ import annotations

import json

from pydantic import ValidationError

from tracer.web.probe.beacon import Beacon
from tracer.web.probe.beacon_error import RULE_ERROR, BeaconError
from tracer.web.probe.schema_nodes import inlined, node_at

_SCHEMA = Beacon.model_json_schema()


def _reject_constant(name: str):
    # json.loads accepts NaN/Infinity by default; they are not JSON and not finite.
    raise BeaconError(422, f"numbers must be finite, got {name}")


def parse_beacon(body: bytes) -> Beacon:
    """The checked beacon in `body`, or BeaconError(400 | 422).

    >>> b = parse_beacon(b'{"v":1,"trace_id":"' + b"ab" * 16 + b'","outcome":"ok",'
    ...     b'"t":{"start":0,"headers":40,"first_byte":41,"first_token":55,"end":90},"junk":1}')
    >>> b.trace_id == "ab" * 16, b.t.first_token, b.chunks
    (True, 55.0, 0)
    >>> try:
    ...     parse_beacon(b'{"v":1,"outcome":"ok","t":{"start":0,"headers":-1,"end":9}}')
    ... except BeaconError as exc:
    ...     print(exc.status, exc.param, exc.message)
    422 t.headers t.headers must be finite and within [0, 3600000] ms: a later milestone is implausible
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BeaconError(400, "beacon body is not UTF-8") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, RecursionError):
        raise BeaconError(400, "beacon body is not valid JSON") from None
    except BeaconError:  # NaN / Infinity, refused by _reject_constant
        raise
    except ValueError:  # an integer past Python's int_max_str_digits (4300 by default)
        raise BeaconError(400, "beacon body has a number with too many digits") from None
    if not isinstance(obj, dict):
        raise BeaconError(422, "a beacon is a JSON object")
    try:
        return Beacon.model_validate(obj)
    except ValidationError as exc:
        raise _refusal(exc.errors(include_url=False, include_input=False)[0]) from None


def _refusal(error: dict) -> BeaconError:
    """The 422 for pydantic's first error: the field it names, and that field's rule."""
    if error["type"] == RULE_ERROR:
        return BeaconError(422, error["msg"], error["ctx"]["param"])
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                    for part in error["loc"]).lstrip(".")
    node = node_at(_SCHEMA, error["loc"])
    if node.get("type") == "number" and error["type"] in ("float_type", "missing"):
        return BeaconError(422, f"{param} must be a number of ms", param)
    return BeaconError(422, f"{param} must be {node.get('description', 'valid')}", param)


def beacon_json_schema() -> dict:
    """The beacon's JSON Schema, self-contained (definitions inlined, no titles), for an
    OpenAPI request body where `#/$defs/...` would not resolve.

    >>> schema = beacon_json_schema()
    >>> schema["required"], schema["properties"]["t"]["properties"]["start"]["maximum"]
    (['v', 'outcome', 't'], 0.0)
    """
    return inlined(_SCHEMA)
