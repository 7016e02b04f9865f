"""Command-line options of `python -m tracer proxy` and the function that runs them.

    python -m tracer proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:8100
"""
from __future__ import annotations

import argparse
import gc
import os
import ssl
import sys
import threading
import time

import httpx

from tracer.proxy.engine_join import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_SKEW_S,
    DEFAULT_WAIT_S,
    JoinSettings,
)
from tracer.proxy.upstream import READ_TIMEOUT_S, UpstreamLimits
from tracer.proxy.upstream_metrics import DEFAULT_PREFIXES
from tracer.web.cli_options import (
    add_observability_arguments,
    connection_limits_from_args,
    observability_settings_from_args,
    parse_listen,
)
from tracer.web.otlp_grpc import DEFAULT_READ_TIMEOUT_S

DEFAULT_LISTEN = "127.0.0.1:8100"


def add_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the proxy options on `parser` (a subcommand parser): its own, then the
    flags it shares with `instrumented_engine serve`."""
    add = parser.add_argument
    add("--upstream", required=True, help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    add("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})")
    add("--served-model-name", action="append", default=None,
        help="a model the upstream serves (repeatable); default: asked from its /v1/models")
    add("--discover-timeout-s", type=float, default=15.0,
        help="how long to wait for the upstream's /v1/models at start")
    add("--upstream-ca-file", default=None,
        help="PEM CA bundle to verify an https:// upstream with (e.g. its self-signed "
             "certificate) instead of the system's CAs; verification is never turned off")
    add("--upstream-api-key", default=os.environ.get("TTFTSCOPE_UPSTREAM_API_KEY"),
        help="the upstream's own API key, sent as 'Authorization: Bearer KEY' on every "
             "request the proxy forwards (env TTFTSCOPE_UPSTREAM_API_KEY, which keeps it out "
             "of ps). Without it, the client's Authorization goes upstream only when the "
             "proxy has no --api-key of its own: the proxy's key never leaves the proxy")
    add("--upstream-api-key-file", default=None, metavar="PATH",
        help="read --upstream-api-key from this file (first line; e.g. a mounted secret)")
    add("--connect-timeout-s", type=float, default=5.0)
    add("--read-timeout-s", type=float, default=READ_TIMEOUT_S,
        help="limit for the response headers and for each gap between body chunks "
             f"(default {READ_TIMEOUT_S:g} s: the longest gap of a streamed completion is "
             "usually the first, engine queueing plus the prefill of the whole prompt, "
             "minutes for a 100k-token prompt on a slow GPU; a hung upstream still frees "
             "its client and pool slot. A non-streamed completion sends its headers only "
             "when done: raise this for longer ones)")
    add("--max-connections", type=int, default=512, help="upstream connection pool size")
    add("--upstream-metrics-path", default="/metrics",
        help="the upstream's Prometheus path to re-export ('' to disable)")
    add("--upstream-metrics-prefix", action="append", default=None,
        help=f"metric-name prefixes re-exported (repeatable; default {' '.join(DEFAULT_PREFIXES)})")
    add_engine_join_arguments(parser)
    add_observability_arguments(parser)


def add_engine_join_arguments(parser: argparse.ArgumentParser) -> None:
    """The OTLP receiver engines export their spans to, and the join that waits for them
    (docs/reference.md, "Engine timing behind the proxy")."""
    add = parser.add_argument
    add("--no-otlp-receiver", dest="otlp_receiver", action="store_false",
        help="do not serve POST /v1/traces (it is then relayed to the upstream like any path)")
    add("--otlp-receiver-token", default=os.environ.get("TTFTSCOPE_OTLP_RECEIVER_TOKEN"),
        help="bearer token POST /v1/traces and gRPC Export require, the engines' own secret: "
             "never the --api-key, which every client holds (with --api-key and no token the "
             "receiver refuses every export); engines send it with "
             "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%%20<token> "
             "(env TTFTSCOPE_OTLP_RECEIVER_TOKEN)")
    add("--otlp-grpc-listen", default=None, metavar="HOST:PORT",
        help="also serve OTLP/gRPC there (e.g. 127.0.0.1:4317): TGI exports only gRPC, "
             "vLLM and SGLang by default")
    add("--otlp-grpc-read-timeout-s", type=float, default=DEFAULT_READ_TIMEOUT_S,
        help="a gRPC Export call must send its request message within this many seconds of "
             f"its start, else DEADLINE_EXCEEDED (default {DEFAULT_READ_TIMEOUT_S:g} s)")
    add("--otlp-receiver-max-bytes", type=int, default=4 << 20,
        help="largest OTLP export body accepted, as sent (default 4 MiB)")
    add("--engine-join-wait-s", type=float, default=DEFAULT_WAIT_S,
        help="how long a finished record waits for its engine's span before it is published "
             f"without (default {DEFAULT_WAIT_S:g} s: the engines' batch exporters send every 5 s)")
    add("--engine-join-max-pending", type=int, default=DEFAULT_MAX_PENDING,
        help=f"records waiting at most; the oldest is published early (default {DEFAULT_MAX_PENDING})")
    add("--engine-clock-skew-ms", type=float, default=DEFAULT_MAX_SKEW_S * 1e3,
        help="largest clock difference with the engine's host tolerated when placing its "
             f"span (default {DEFAULT_MAX_SKEW_S * 1e3:g} ms; a sidecar shares its clock)")
    add("--engine-spans-expected", action="store_true",
        help="wait for engine spans from the first request (default: only once one has arrived)")


def join_settings_from_args(args: argparse.Namespace) -> JoinSettings:
    return JoinSettings(wait_s=args.engine_join_wait_s, max_pending=args.engine_join_max_pending,
                        max_skew_s=args.engine_clock_skew_ms / 1e3,
                        spans_expected=args.engine_spans_expected)


def discover_model_names(upstream_url: str, timeout_s: float,
                         transport: httpx.BaseTransport | None = None,
                         verify: ssl.SSLContext | bool = True) -> tuple[str, ...]:
    """The ids in the upstream's `/v1/models`, retried until `timeout_s` (it may still be
    starting); () when it never answers."""
    deadline = time.monotonic() + timeout_s
    wait = threading.Event()
    with httpx.Client(timeout=min(timeout_s, 5.0), trust_env=False, transport=transport,
                      verify=verify) as client:
        while True:
            try:
                data = client.get(upstream_url.rstrip("/") + "/v1/models").json().get("data", [])
                return tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
            except (httpx.HTTPError, ValueError, AttributeError, TypeError):
                if time.monotonic() >= deadline:
                    return ()
                wait.wait(0.5)


def upstream_api_key_from_args(args: argparse.Namespace) -> str | None:
    """`--upstream-api-key` (or its env var), or the first line of `--upstream-api-key-file`;
    ValueError when the file is unreadable or empty."""
    path, key = getattr(args, "upstream_api_key_file", None), getattr(args, "upstream_api_key", None)
    if not path:
        return key or None
    if key:
        raise ValueError("give the upstream's key once: --upstream-api-key (or "
                         "TTFTSCOPE_UPSTREAM_API_KEY) or --upstream-api-key-file")
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--upstream-api-key-file {path}: {exc}") from None
    if not key:
        raise ValueError(f"--upstream-api-key-file {path}: the file's first line is empty")
    return key


def settings_from_args(args: argparse.Namespace):
    from tracer.proxy.app import ProxySettings, otlp_receiver_token
    otlp_receiver_token(args.otlp_receiver_token, args.api_key)   # ValueError: the same secret
    if not args.otlp_grpc_read_timeout_s > 0:
        raise ValueError("--otlp-grpc-read-timeout-s must be > 0")
    return ProxySettings(
        upstream_url=args.upstream,
        upstream_ca_file=args.upstream_ca_file,
        upstream_api_key=upstream_api_key_from_args(args),
        limits=UpstreamLimits(connect_timeout_s=args.connect_timeout_s,
                              read_timeout_s=args.read_timeout_s,
                              max_connections=args.max_connections),
        observability=observability_settings_from_args(args),
        http_spans=args.http_spans,
        upstream_metrics_path=args.upstream_metrics_path or None,
        upstream_metrics_prefixes=tuple(args.upstream_metrics_prefix or DEFAULT_PREFIXES),
        otlp_receiver=args.otlp_receiver, otlp_receiver_token=args.otlp_receiver_token,
        otlp_receiver_max_bytes=args.otlp_receiver_max_bytes,
        otlp_grpc_listen=args.otlp_grpc_listen,
        otlp_grpc_read_timeout_s=args.otlp_grpc_read_timeout_s,
        join=join_settings_from_args(args))


# The youngest generation is collected every 50,000 net allocations instead of 700, the
# older ones every 20 and 100 of those instead of 10 and 10. A relayed request allocates
# hundreds of short-lived objects that reference counting frees anyway; with the defaults a
# collection ran every few requests, and each older one walked every open stream and the
# trace store's 10,000 records. At 1,000 streams (`bench/proxy_overhead.py --scale`, timed
# with `gc.callbacks`) the defaults made ~730 collections, 0.8-2.0 s in all, with pauses of
# up to 150 ms; these ~220, ~0.35 s, up to 60-77 ms. Cyclic garbage still goes, in fewer,
# larger batches.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_runtime_for_latency(switch_interval_s: float = 0.0005) -> None:
    """Process-wide settings for a relay whose every stall shows up in someone's TTFT.

    - `gc.freeze()` once the app is built: the ~100k objects of FastAPI, pydantic and the
      OTel SDK go to the permanent generation, so the full collections that still come (as
      the trace store fills) walk only what was made since: a full collection of 300k
      objects takes ~20 ms here, one of 18k ~0.4 ms.
    - `GC_THRESHOLDS`: far fewer collections of the young generations (see there).
    - A 0.5 ms GIL switch interval (default 5 ms): whenever the span export thread runs
      Python, the event loop waits up to one interval for the GIL at each wake-up. With the
      SDK's exporter, p99 TTFT at 32 streams was 31 ms with 5 ms and 6.6 ms with 0.5 ms.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(switch_interval_s)


def run_proxy_command(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit status 2 on bad options."""
    from tracer.proxy.app import create_proxy_app
    from tracer.sinks.logs import configure_logging
    from tracer.web.server_options import run_server
    try:
        host, port = parse_listen(args.listen)
        settings = settings_from_args(args)
        limits = connection_limits_from_args(args)
    except ValueError as exc:
        print(f"proxy: {exc}", file=sys.stderr)
        return 2
    logger = configure_logging(args.log_format)
    if settings.otlp_receiver and settings.observability.api_key and not settings.otlp_receiver_token:
        logger.warning("otlp_receiver_closed", detail="--api-key is set and "
                       "--otlp-receiver-token is not: every span export is refused (401 / "
                       "UNAUTHENTICATED); give the engines a token of their own")
    from tracer.proxy.app import upstream_tls_context
    names = tuple(args.served_model_name or ()) or discover_model_names(
        args.upstream, args.discover_timeout_s,
        verify=upstream_tls_context(settings.upstream_ca_file))
    if not names:
        logger.warning("proxy_models_unknown", upstream=args.upstream,
                       detail="no --served-model-name and /v1/models did not answer: "
                              "every request is labelled model=other")
    from tracer.store.open import describe_store
    from tracer.store.schema import StoreError
    try:
        parts = create_proxy_app(settings, model_names=names, logger=logger)
    except StoreError as exc:
        print(f"proxy: {exc}", file=sys.stderr)
        return 2
    tune_runtime_for_latency()
    logger.info("proxy_listening", listen=f"{host}:{port}", upstream=args.upstream,
                models=list(names), store=describe_store(parts.obs.store))
    # The proxy appends the peer to X-Forwarded-For itself (run_server leaves uvicorn's
    # rewriting of the client address off).
    run_server(parts.app, host=host, port=port, limits=limits, lifespan="on")
    return 0
