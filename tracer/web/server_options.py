"""uvicorn's fast paths, asked for by name: uvloop (libuv event loop) and httptools (llhttp).

uvicorn's `loop="auto"`/`http="auto"` silently fall back to asyncio and h11 when a wheel is
missing, and the server is then measurably slower (bench/proxy_overhead.py). Both fronts (the
engine's `serve` and `tracer proxy`) pass these options to `uvicorn.run`, so the fast paths
are explicit and a fallback is announced (a log warning, or a stderr line without logging).
"""
from __future__ import annotations

import importlib
import logging
import sys

_log = logging.getLogger(__name__)

# uvicorn option -> (value, module that must import for it)
_FAST = {"loop": ("uvloop", "uvloop"), "http": ("httptools", "httptools")}


def fast_server_options(*, warn: bool = True) -> dict[str, str]:
    """`{"loop": "uvloop", "http": "httptools"}`, less any part whose module won't import;
    a missing part is reported (stderr + log warning) and left to uvicorn's "auto".

    >>> sorted(fast_server_options())      # both wheels are dependencies of ttftscope
    ['http', 'loop']
    """
    options: dict[str, str] = {}
    missing: list[str] = []
    for option, (value, module) in _FAST.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
        else:
            options[option] = value
    if missing and warn:
        message = (f"ttftscope: {' and '.join(missing)} not importable: uvicorn falls back to "
                   f"{'asyncio' if 'uvloop' in missing else 'uvloop'}/"
                   f"{'h11' if 'httptools' in missing else 'httptools'} and this server will be "
                   f"slower (install ttftscope's dependencies: pip install uvloop httptools)")
        if logging.getLogger().handlers:
            _log.warning(message)        # the app's log (stderr or wherever it goes)
        else:
            print(message, file=sys.stderr, flush=True)
    return options
