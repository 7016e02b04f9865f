"""Command-line options of `python -m tracer collect` and the function that runs them.

    python -m tracer collect --listen 0.0.0.0:8200 --beacon-key "$TTFTSCOPE_BEACON_KEY" \\
        --served-model-name smollm2 --cors-origin https://chat.example
"""
from __future__ import annotations

import argparse
import os
import sys

from tracer.collect.pending import (
    DEFAULT_MAX_SPANS_PER_TRACE,
    DEFAULT_MAX_TRACES,
    DEFAULT_WAIT_S,
)
from tracer.collect.whole_path import DEFAULT_MAX_SKEW_S
from tracer.record.segment_names import DEFAULT_TOP_N
from tracer.web.cli_options import (
    add_observability_arguments,
    connection_limits_from_args,
    observability_settings_from_args,
    parse_listen,
)

DEFAULT_LISTEN = "127.0.0.1:8200"


def add_collect_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the collector's options: its own, then the shared ones (`--beacon-key`,
    `--cors-origin`, the beacon limits, `--forwarded-allow-ips`, ...)."""
    add = parser.add_argument
    add("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})")
    add("--served-model-name", action="append", default=None,
        help="a model label the servers report (repeatable); others are counted as `other`")
    add("--max-joined-traces", type=int, default=100_000,
        help="trace ids remembered so a second beacon of a trace is refused (bounded memory)")
    add("--otlp-receiver-token", default=os.environ.get("TTFTSCOPE_OTLP_RECEIVER_TOKEN"),
        help="bearer token POST /v1/traces requires; engines send it with "
             "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%%20<token> "
             "(env TTFTSCOPE_OTLP_RECEIVER_TOKEN; --api-key is refused here: no key gate)")
    add("--otlp-grpc-listen", default=None, metavar="HOST:PORT",
        help="also serve OTLP/gRPC there (e.g. 127.0.0.1:4317): vLLM's and SGLang's default")
    add("--join-wait-s", type=float, default=DEFAULT_WAIT_S,
        help="how long a trace waits for its beacon, backend spans and engine timing after "
             f"its first part arrived (default {DEFAULT_WAIT_S:g} s: batch exporters send "
             "every 5 s)")
    add("--max-pending-traces", type=int, default=DEFAULT_MAX_TRACES,
        help="traces held at once; past it the oldest is assembled early (bounded memory)")
    add("--max-spans-per-trace", type=int, default=DEFAULT_MAX_SPANS_PER_TRACE,
        help="spans kept per trace; the rest are counted over_limit")
    add("--path-segment", action="append", default=None, metavar="SPAN_NAME",
        help="a backend span name always kept as its own `segment` label (repeatable)")
    add("--path-top-n", type=int, default=DEFAULT_TOP_N,
        help="how many more backend span names become labels, by critical-path time "
             f"(default {DEFAULT_TOP_N}; the rest are `other`)")
    add("--beacon-relay-url", default=None, metavar="URL",
        help="with N collectors behind an OTel Collector `loadbalancing` exporter "
             "(routing_key: traceID): its OTLP/HTTP traces endpoint; each beacon goes through "
             "it, as a span, to the collector owning its trace")
    add("--max-clock-skew-s", type=float, default=DEFAULT_MAX_SKEW_S,
        help="how far the engine's clock may disagree with the backend's before its stages "
             f"are not placed (default {DEFAULT_MAX_SKEW_S:g} s)")
    add_observability_arguments(parser)


def settings_from_args(args: argparse.Namespace):
    """The collector's settings; ValueError without a beacon key (it could verify nothing).

    >>> p = argparse.ArgumentParser(); add_collect_arguments(p)
    >>> settings_from_args(p.parse_args(["--beacon-key", "k", "--served-model-name", "m"])).model_names
    ('m',)
    """
    from tracer.collect.app import CollectorSettings
    obs = observability_settings_from_args(args)
    if not obs.beacon_key:
        raise ValueError("--beacon-key (or TTFTSCOPE_BEACON_KEY) is required: it is the key "
                         "the servers sign their in-band timing with")
    if args.max_joined_traces < 1:
        raise ValueError("--max-joined-traces must be >= 1")
    if obs.api_key:
        raise ValueError("--api-key: the collector has no key gate (/v1/probe, /metrics and "
                         "/health are open); its OTLP receiver's token is "
                         "--otlp-receiver-token")
    for name in ("max_pending_traces", "max_spans_per_trace"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.path_top_n < 0:
        raise ValueError("--path-top-n must be >= 0")
    if not args.join_wait_s > 0 or not args.max_clock_skew_s >= 0:
        raise ValueError("--join-wait-s must be > 0 and --max-clock-skew-s >= 0")
    if args.otlp_grpc_listen:
        parse_listen(args.otlp_grpc_listen)
    return CollectorSettings(observability=obs, model_names=tuple(args.served_model_name or ()),
                             max_joined_traces=args.max_joined_traces,
                             otlp_receiver_token=args.otlp_receiver_token or None,
                             otlp_grpc_listen=args.otlp_grpc_listen,
                             join_wait_s=args.join_wait_s,
                             max_pending_traces=args.max_pending_traces,
                             max_spans_per_trace=args.max_spans_per_trace,
                             path_segments=tuple(args.path_segment or ()),
                             path_top_n=args.path_top_n, max_skew_s=args.max_clock_skew_s,
                             beacon_relay_url=args.beacon_relay_url or None)


def run_collect_command(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit status 2 on bad options."""
    from tracer.collect.app import create_collector_app
    from tracer.sinks.logs import configure_logging
    from tracer.web.server_options import run_server
    try:
        host, port = parse_listen(args.listen)
        settings = settings_from_args(args)
        limits = connection_limits_from_args(args)
    except ValueError as exc:
        print(f"collect: {exc}", file=sys.stderr)
        return 2
    from tracer.store.open import describe_store
    from tracer.store.schema import StoreError
    logger = configure_logging(args.log_format)
    try:
        parts = create_collector_app(settings)
    except StoreError as exc:
        print(f"collect: {exc}", file=sys.stderr)
        return 2
    logger.info("collector_listening", listen=f"{host}:{port}",
                models=list(settings.model_names), store=describe_store(parts.store))
    run_server(parts.app, host=host, port=port, limits=limits, lifespan="on")
    return 0
