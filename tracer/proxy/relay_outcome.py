"""How a proxied request ended: the (finish_reason, error_type) pair its record, metrics and
log line carry, decided in one place (`request_outcome`) from what the relay saw or why no
answer came (tracer/proxy/stream.py, `Relay.final_outcome`)."""
from __future__ import annotations

from typing import Protocol

from tracer.proxy.upstream_errors import UpstreamFailure
from tracer.record.errors import ABORT, TIMEOUT, UPSTREAM


class Relayed(Protocol):
    """A relay that ran (tracer/proxy/stream.py, `Relay`), as far as its outcome goes."""

    def final_outcome(self) -> tuple[str, str | None]: ...


class RelayStatus:
    """Why a relay ended: (finish_reason, error_type) pairs.

    >>> RelayStatus.CUT
    ('error', 'upstream')
    """

    ABORTED = ("abort", ABORT)
    CUT = ("error", UPSTREAM)
    TIMED_OUT = ("error", TIMEOUT)


def request_outcome(relay: Relayed | None,
                    failure: UpstreamFailure | None) -> tuple[str, str | None]:
    """(finish_reason, error_type) of a proxied request: the one place it is decided. With a
    relay, what the relay saw (`Relay.final_outcome`); without one, why no answer came.

    >>> request_outcome(None, UpstreamFailure(504, "timeout", "slow"))
    ('error', 'timeout')
    >>> request_outcome(None, UpstreamFailure.client_gone())
    ('abort', 'abort')
    """
    if relay is not None:
        return relay.final_outcome()
    if failure is None or failure.is_client_gone:
        return RelayStatus.ABORTED
    return "error", failure.error_type
