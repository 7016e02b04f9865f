"""How the upstream hop fails: the connection's errors (`UpstreamError` and its kinds, raised by
`tracer.proxy.http1`) and the proxy's own answer when no response came (`UpstreamFailure`,
decided by `tracer.proxy.upstream`: refused or broken before any answer is a 502, no
answer within the read timeout a 504).
"""
from __future__ import annotations

from tracer.record.errors import ABORT
from tracer.web.openai_http import CLIENT_CLOSED_REQUEST


class UpstreamError(Exception):
    """The upstream exchange failed; `received_any` tells whether a response byte came."""

    def __init__(self, message: str, *, received_any: bool = False) -> None:
        super().__init__(message)
        self.received_any = received_any


class UpstreamClosed(UpstreamError):
    """The connection closed or reset before the response ended."""


class UpstreamClosedBeforeSend(UpstreamClosed):
    """The connection was seen closed before any byte of the request was written: the
    upstream cannot have read it, so it may be sent on another connection."""


class UpstreamTimeout(UpstreamError):
    """No byte for longer than the read timeout."""


class UpstreamProtocolError(UpstreamError):
    """The upstream's bytes are not HTTP/1.1."""


class UpstreamHeadTooLarge(UpstreamProtocolError):
    """The response head outgrew `max_head_bytes` or `max_headers`."""


class UpstreamFailure(Exception):
    """The upstream could not be asked or did not answer: the proxy's own error response.

    `status` is what the client gets (502: refused or broken, 504: timed out) and
    `error_type` what the metrics count.

    >>> from tracer.record.errors import TIMEOUT
    >>> UpstreamFailure(504, TIMEOUT, "upstream timed out").status
    504
    """

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message

    @classmethod
    def client_gone(cls) -> UpstreamFailure:
        """The client left before an answer came: nobody gets a response. 499 is nginx's
        name for it ("client closed request"), never sent on the wire.

        >>> UpstreamFailure.client_gone().is_client_gone
        True
        """
        return cls(CLIENT_CLOSED_REQUEST, ABORT, "the client went away")

    @property
    def is_client_gone(self) -> bool:
        return self.status == CLIENT_CLOSED_REQUEST
