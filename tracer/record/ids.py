"""Random ids with no system call on the request path.

`os.urandom` (behind `uuid.uuid4`, `secrets` and `random.SystemRandom`) releases the GIL for
its `getrandom` call, and then waits to take it back: with another Python thread busy (the
record worker, an exporter, the engine's step thread) one call took 1.2-2.1 ms instead of
4 µs. So ids (trace, span, request) come from a Mersenne Twister seeded from the OS, as the
OpenTelemetry SDK's `RandomIdGenerator` makes them, and re-seeded in a forked child so
workers never share a sequence. Those ids are unique, not secret: they go out in headers.
A secret id (the upstream's parent span id, which the engine join trusts) comes from keyed
BLAKE2b over a counter: a PRF with a key read from the OS once, so it is unpredictable from
any number of the ids clients see, and hashing 8 bytes keeps the GIL (hashlib lets it go
only for inputs over 2 KiB). tests/server/test_no_gil_release.py and
tests/proxy/test_proxy_no_gil_release.py check the request path makes no such call.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import random

ID_RNG = random.Random()          # seeded from os.urandom at construction
_SECRET = {"key": os.urandom(32), "counter": itertools.count()}


def new_secret_span_id() -> str:
    """16 hex digits no client can predict, never all zero (W3C Trace Context: an all-zero
    parent-id is invalid).

    >>> a, b = new_secret_span_id(), new_secret_span_id(); len(a), a != b
    (16, True)
    """
    while True:
        n = next(_SECRET["counter"])      # itertools.count: atomic under the GIL
        span_id = hashlib.blake2b(n.to_bytes(8, "little"), key=_SECRET["key"],
                                  digest_size=8).hexdigest()
        if span_id != "0000000000000000":
            return span_id


def _rekey() -> None:
    # A forked worker must not repeat its parent's secret ids.
    _SECRET["key"], _SECRET["counter"] = os.urandom(32), itertools.count()


def new_request_id(prefix: str) -> str:
    """`<prefix>-<32 hex>`: a request's id, as unique as a uuid4.

    >>> rid = new_request_id("chatcmpl"); rid.startswith("chatcmpl-"), len(rid)
    (True, 41)
    """
    return f"{prefix}-{ID_RNG.getrandbits(128):032x}"


os.register_at_fork(after_in_child=ID_RNG.seed)
os.register_at_fork(after_in_child=_rekey)
