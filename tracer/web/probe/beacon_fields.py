"""The beacon's bounds and the checked types of its fields: numbers finite and within sane
bounds, strings length- and charset-bounded. A beacon comes from any browser, so each type
refuses what a page could get wrong or forge; each `description` is also the field's rule in
the 422's message (`<param> must be <description>`, `tracer/web/probe/schema.py`).

>>> from pydantic import TypeAdapter
>>> url_path = TypeAdapter(UrlPath)
>>> url_path.validate_python("/v1/chat/completions"), url_path.validate_python("/a b")
('/v1/chat/completions', None)
"""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from tracer.record.emits import MAX_SEND_TIMES
from tracer.record.traceparent import parse_traceparent

OUTCOMES = ("ok", "http_error", "aborted", "network_error")
SCHEMA_VERSION = 1
# A day in ms: longer than any chat stream, short enough to keep sums and spans sane.
MAX_MS = 86_400_000.0
# No browser waits an hour for a first token: a later milestone is a lie, not a measurement,
# and one such beacon would move a histogram's sum by hours (issue: "86,399,992 ms").
MAX_MILESTONE_MS = 3_600_000.0
MAX_COUNT = 10_000_000
# The probe reports the arrival of the first this-many content chunks (`chunk_ms`): the
# server's send times are bounded by the same number, so the two pair one to one.
MAX_CHUNK_TIMES = MAX_SEND_TIMES
MAX_SERVER_TOKEN_CHARS = 2048
# The probe lists the first this-many tool calls of a stream, each function name cut to this
# many characters (frontend_probe/formats.js, MAX_CALLS): never arguments.
MAX_TOOL_CALLS = 8
MAX_TOOL_NAME_CHARS = 64
_ZERO_TRACE_ID = "0" * 32   # W3C Trace Context: an all-zero trace id is invalid
_URL_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,255}")
_SDK = re.compile(r"[A-Za-z0-9._@/+ -]{1,64}")
_MODEL = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")
_TOKEN = re.compile(r"[0-9a-f]{64}")   # tracer/web/probe/token.py
# A function name as the APIs allow them (OpenAI and Anthropic: [a-zA-Z0-9_-]{1,64}; Gemini
# adds '.' and ':'); any other name is kept as None, its times still count.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:/@+-]{1,64}")


def _ms(max_ms: float, rule: str | None = None):
    """A number of ms in [0, max_ms]; `strict` refuses booleans and numeric strings."""
    return Annotated[float, Field(strict=True, ge=0, le=max_ms, allow_inf_nan=False,
                                  description=rule or f"finite and within [0, {max_ms:.0f}] ms")]


def _bounded_string(max_chars: int):
    return Annotated[str, Field(strict=True, max_length=max_chars,
                                description=f"a string of at most {max_chars} characters")]


def _page_string(max_chars: int, pattern: re.Pattern):
    """A string the page chose: longer than `max_chars` is a 422, one off `pattern` becomes
    None (a caller's odd URL path is the page's business, not a reason to lose the timings)."""
    return Annotated[_bounded_string(max_chars),
                     AfterValidator(lambda text: text if pattern.fullmatch(text) else None)]


def _normalised_traceparent(text: str) -> str | None:
    """The W3C traceparent the probe sent, normalised; None when the page's own was invalid."""
    parsed = parse_traceparent(text)
    return None if parsed is None else str(parsed)


def _refuse_bool(value: object) -> object:
    # JSON's true is not the version 1, though Python's True == 1.
    if isinstance(value, bool):
        raise ValueError("a boolean")
    return value


def _refuse_zero_trace_id(trace_id: str) -> str:
    if trace_id == _ZERO_TRACE_ID:
        raise ValueError("all zero")
    return trace_id


Ms = _ms(MAX_MS)
Milestone = _ms(MAX_MILESTONE_MS, f"finite and within [0, {MAX_MILESTONE_MS:.0f}] ms: a later "
                                  "milestone is implausible")
StartMs = _ms(0.0, "0 (times are relative to fetch())")
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT,
                             description=f"an integer in [0, {MAX_COUNT}]")]
Version = Annotated[Literal[SCHEMA_VERSION], BeforeValidator(_refuse_bool),
                    Field(description=f"{SCHEMA_VERSION}, the beacon version this server reads")]
TraceId = Annotated[str, Field(strict=True, pattern="^[0-9a-f]{32}$",
                               json_schema_extra={"not": {"const": _ZERO_TRACE_ID}}),
                    AfterValidator(_refuse_zero_trace_id)]
Traceparent = Annotated[_bounded_string(256), AfterValidator(_normalised_traceparent)]
# The in-band timing token (tracer/web/inband.py), `<base64url payload>.<base64url HMAC>`,
# copied verbatim by the probe: a malformed one is a 422, not the page's business.
ServerToken = Annotated[str, Field(strict=True, max_length=MAX_SERVER_TOKEN_CHARS,
                                   pattern=r"^[A-Za-z0-9_-]{1,2000}\.[A-Za-z0-9_-]{43}$")]
HttpStatus = Annotated[int, Field(strict=True, ge=100, le=599)]
UrlPath = _page_string(2048, _URL_PATH)
Sdk = _page_string(256, _SDK)
ModelName = _page_string(256, _MODEL)
# The server's beacon token from Server-Timing (tracer/web/probe/token.py).
BeaconToken = _page_string(128, _TOKEN)
ToolName = _page_string(MAX_TOOL_NAME_CHARS, _TOOL_NAME)
