"""A guard for the request path: the calls that hand the GIL away and must wait to get it
back, made to fail while the guard is on (tracer/record/ids.py says what they cost).

    with forbid_gil_release() as seen:
        ...   # serve a request
    assert seen == []

`os.urandom` stands for everything that reads OS randomness (`uuid.uuid4`, `secrets`,
`random.SystemRandom` bind it at import, so each binding is patched), `hmac.digest` for the
one-shot HMAC that OpenSSL runs with the GIL released (`hmac.new(...).digest()` keeps it for
short messages). A call made while the guard is on is recorded and raises, so a caller that
swallows errors still shows up in `seen`.
"""
from __future__ import annotations

import contextlib
import hmac
import os
import random
import traceback
from collections.abc import Iterator


class GilReleaseCall(RuntimeError):
    """A GIL-releasing call happened where none may."""


@contextlib.contextmanager
def forbid_gil_release() -> Iterator[list[str]]:
    seen: list[str] = []

    def refuse(name: str):
        def call(*args, **kwargs):
            seen.append(f"{name} from " + "".join(traceback.format_stack(limit=6)[:-1]))
            raise GilReleaseCall(f"{name} releases the GIL on the request path")
        return call

    patches = [(os, "urandom"), (random, "_urandom"), (hmac, "digest")]
    saved = [getattr(module, name) for module, name in patches]
    try:
        for module, name in patches:
            setattr(module, name, refuse(f"{module.__name__}.{name}"))
        yield seen
    finally:
        for (module, name), value in zip(patches, saved):
            setattr(module, name, value)
