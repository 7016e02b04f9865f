"""The JSON text of the tracer's own documents (a request's log line, its stored record):
orjson writes it where it can, the standard library where it cannot; read back, the values
are the same either way (tests/tracer/test_json_text.py compares them over any document).

Why: `json` spent ~22 µs on a request's log line and ~38 µs on its stored document, per
record, on the tracer's worker (bench machine, docs/figures.md "The tracer's own cost");
orjson writes them in ~3 and ~7. What orjson refuses, `json` writes instead: a string that
is not valid UTF-8 (a lone surrogate, which the store keeps as an escape), an integer beyond
64 bits, a key that is not a string. Dataclasses and datetimes go to `default`, as with `json`
(orjson would write them its own way). Where orjson writes, two differences remain: NaN and
the infinities are written as `null` (`json` writes `NaN`, which no JSON reader but
Python's takes), and non-ASCII text as UTF-8, not as `\\u` escapes (the same string once
read).
"""
from __future__ import annotations

import json
from collections.abc import Callable

import orjson

_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def json_writer(*, default: Callable | None = None,
                separators: tuple[str, str] | None = None) -> Callable[[object], str]:
    """`obj -> JSON text`: orjson's, or `json.JSONEncoder(default=default,
    separators=separators).encode`'s for what orjson refuses (module docstring).

    >>> write = json_writer(default=str)
    >>> write({"a": [1, 2.5, None], "b": "é", "c": b"x"})
    '{"a":[1,2.5,null],"b":"é","c":"b\\'x\\'"}'
    >>> write({"lone": "\\udc80"})          # not valid UTF-8: json's escape
    '{"lone": "\\\\udc80"}'
    """
    fallback = json.JSONEncoder(default=default, separators=separators).encode
    dumps = orjson.dumps

    def write(obj: object) -> str:
        try:
            return dumps(obj, default=default, option=_OPTIONS).decode()
        except TypeError:   # orjson.JSONEncodeError is one: what only json writes
            return fallback(obj)

    return write
