"""Command-line options of `python -m tracer collect` and the function that runs them.

    python -m tracer collect --listen 0.0.0.0:8200 --beacon-key "$TTFTSCOPE_BEACON_KEY" \\
        --served-model-name smollm2 --cors-origin https://chat.example
"""
from __future__ import annotations

import argparse
import os
import sys

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
    return CollectorSettings(observability=obs, model_names=tuple(args.served_model_name or ()),
                             max_joined_traces=args.max_joined_traces,
                             otlp_receiver_token=args.otlp_receiver_token or None)


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
    logger = configure_logging(args.log_format)
    parts = create_collector_app(settings)
    logger.info("collector_listening", listen=f"{host}:{port}",
                models=list(settings.model_names))
    run_server(parts.app, host=host, port=port, limits=limits, lifespan="on")
    return 0
