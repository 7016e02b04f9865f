"""The error vocabulary: the closed set of `error.type` values a record, a span or a metric
label may carry (docs/architecture.md, "The stage contract")."""
from __future__ import annotations

from tracer.record.request_record import RequestRecord

# Each error type once, by name, so a front sets `error_type=ABORT`, never a literal.
ABORT = "abort"                      # the client left (or the server shut down mid-request)
ERROR = "error"                      # the request failed, no more precise type known
TIMEOUT = "timeout"
INVALID_REQUEST = "invalid_request"  # the client's input: a 400
INTERNAL = "internal"                # our bug or the engine failing on this request: a 500
UPSTREAM = "upstream"
# A client still connected but not reading: its stream outgrew its bound and was aborted
# (docs/architecture.md, "Through the engine").
SLOW_READER = "slow_reader"
# What can fail in front of our engine. A request string never becomes an error type.
ERROR_TYPES: tuple[str, ...] = (ABORT, ERROR, TIMEOUT, INVALID_REQUEST, INTERNAL, UPSTREAM,
                                SLOW_READER)
# What can go wrong between the proxy and a foreign upstream, on top of those: refused or
# unreachable (502) and an upstream 5xx relayed as is. A timeout is `timeout` (504 or a
# stream that stalls), a stream that breaks off is `upstream`, a client that leaves `abort`.
UPSTREAM_UNAVAILABLE = "upstream_unavailable"   # refused or unreachable: a 502
UPSTREAM_STATUS = "upstream_status"             # the upstream's own 5xx, relayed as is
PROXY_ERROR_TYPES: tuple[str, ...] = ERROR_TYPES + (UPSTREAM_UNAVAILABLE, UPSTREAM_STATUS)
_ERROR_FINISH_REASONS = frozenset(("abort", "error"))


def error_type_of(record: RequestRecord) -> str | None:
    """`error.type` for a failed request: its error type, else the failing finish reason.

    >>> error_type_of(RequestRecord("r", "0" * 32, "0" * 16, "m", "chat", 0, 1, finish_reason="abort"))
    'abort'
    """
    if record.error_type:
        return record.error_type
    if record.finish_reason in _ERROR_FINISH_REASONS:
        return record.finish_reason
    return None
