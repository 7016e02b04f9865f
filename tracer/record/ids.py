"""Random ids with no system call on the request path.

`os.urandom` (behind `uuid.uuid4`, `secrets` and `random.SystemRandom`) releases the GIL for
its `getrandom` call, and then waits to take it back: with another Python thread busy (the
record worker, an exporter, the engine's step thread) one call took 1.2-2.1 ms instead of
4 µs. So ids (trace, span, request) come from a Mersenne Twister seeded from the OS, as the
OpenTelemetry SDK's `RandomIdGenerator` makes them, and re-seeded in a forked child so
workers never share a sequence. Ids are unique, not secret: they go out in headers.
tests/tracer/test_no_gil_release.py checks the request path makes no such call.
"""
from __future__ import annotations

import os
import random

ID_RNG = random.Random()          # seeded from os.urandom at construction


def new_request_id(prefix: str) -> str:
    """`<prefix>-<32 hex>`: a request's id, as unique as a uuid4.

    >>> rid = new_request_id("chatcmpl"); rid.startswith("chatcmpl-"), len(rid)
    (True, 41)
    """
    return f"{prefix}-{ID_RNG.getrandbits(128):032x}"


os.register_at_fork(after_in_child=ID_RNG.seed)
