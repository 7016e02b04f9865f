"""uvicorn's fast paths, asked for by name: uvloop (libuv event loop) and httptools (llhttp).

uvicorn's `loop="auto"`/`http="auto"` silently fall back to asyncio and h11 when a wheel is
missing, and the server is then measurably slower (bench/proxy_overhead.py). The fronts (the
engine's `serve`, `tracer proxy` and `tracer collect`) run uvicorn with these options
(`run_server`), so the fast paths are explicit and a fallback is announced (a log warning,
or a stderr line without logging).
"""
from __future__ import annotations

import gc
import importlib
import logging
import sys

from tracer.web.limits import ConnectionLimits

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


def uvicorn_limit_options(limits: ConnectionLimits, fast_options: dict) -> dict:
    """`fast_options` (`fast_server_options`) with the limits (`tracer.web.limits`): the
    guarded protocol in place of httptools; on the h11 fallback, uvicorn's own header-size
    and concurrency knobs (which have no header or body timeout).

    >>> opts = uvicorn_limit_options(ConnectionLimits(), {"loop": "uvloop", "http": "httptools"})
    >>> opts["http"].limits.max_connections, opts["timeout_keep_alive"]
    (1000, 5.0)
    """
    options = dict(fast_options, timeout_keep_alive=limits.keep_alive_timeout_s)
    if options.get("http") == "httptools":
        from tracer.web.http_guard import guarded_protocol_class  # uvicorn: only to serve
        options["http"] = guarded_protocol_class(limits)
    else:
        options["h11_max_incomplete_event_size"] = limits.max_header_bytes
        options["limit_concurrency"] = limits.max_connections + 1   # uvicorn counts itself
    return options


def run_server(app, *, host: str, port: int, limits: ConnectionLimits, **options) -> None:
    """uvicorn as every ttftscope front runs it: the fast paths, the connection limits, no
    access log, and uvicorn's proxy headers off (`--forwarded-allow-ips`, the app's own
    middleware, decides alone who the client is), ticking once a second (`QuietServer`).
    `options` go to `uvicorn.Config` as well."""
    import uvicorn  # only to serve: tests build the apps without it
    from uvicorn.config import STARTUP_FAILURE

    from tracer.web.quiet_server import QuietServer

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            proxy_headers=False,
                            **uvicorn_limit_options(limits, fast_server_options()), **options)
    tune_gc_for_serving()
    server = QuietServer(config)
    try:
        server.run()
    except KeyboardInterrupt:   # as `uvicorn.run`: a second Ctrl-C ends it without a trace
        pass
    if not server.started:   # as `uvicorn.run`: a failed start-up is a failed command
        sys.exit(STARTUP_FAILURE)


def tune_gc_for_serving() -> None:
    """Tune the garbage collector for serving, as the servers do before they start:

    - everything alive now (the imports, the app, an engine's model and KV cache tables)
      moves to the permanent generation, as SGLang's `freeze_gc` and vLLM's
      `freeze_gc_heap` do after start-up: a full collection then walks only what serving
      made since (chiefly the trace store's ring of records), not the ~200,000 objects a
      server starts with. Frozen objects are still freed when their last reference goes;
      only a cycle among them would wait for `gc.unfreeze`;
    - the youngest generation is collected every `GEN0_THRESHOLD` allocations instead of
      700: a request's temporaries are freed by reference counting long before, and the
      collections that remain are rare (bench/tracer_cost.py: the collector's pauses from
      ~22-28 to ~2 µs a request; docs/figures.md, "The tracer's own cost"). The older
      generations keep their default thresholds."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


# Allocations of tracked objects between collections of the youngest generation (CPython's
# default: 700). A cycle of garbage waits at most this many allocations longer.
GEN0_THRESHOLD = 10_000
