"""The command-line flags both fronts share (`instrumented_engine serve`, `tracer proxy`):
one name and one default per setting, read into one `ObservabilitySettings`."""
from __future__ import annotations

import argparse

from tracer.web.observability import ObservabilitySettings

_DEFAULTS = ObservabilitySettings()


def add_observability_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the shared flags on `parser`.

    >>> p = argparse.ArgumentParser(); add_observability_arguments(p)
    >>> s = observability_settings_from_args(p.parse_args(
    ...     ["--cors-origin", "https://a.example,https://b.example", "--cors-origin", "https://c.example"]))
    >>> s.cors_origins, s.tracing, s.ui
    (('https://a.example', 'https://b.example', 'https://c.example'), True, True)
    """
    add = parser.add_argument
    # `--cors-origins` is the engine's old spelling, kept as an alias.
    add("--cors-origin", "--cors-origins", dest="cors_origin", action="append", default=[],
        help="allowed browser origin (repeatable, or comma-separated); CORS off when none")
    add("--max-body-bytes", type=int, default=_DEFAULTS.max_body_bytes,
        help="largest completion request body accepted (413 above)")
    add("--trace-store-capacity", type=int, default=_DEFAULTS.trace_store_capacity,
        help="finished requests kept in memory for /ui and beacon joins")
    add("--probe-max-bytes", type=int, default=_DEFAULTS.probe_max_bytes,
        help="largest browser beacon accepted on /v1/probe")
    add("--probe-rate-per-s", type=float, default=_DEFAULTS.probe_rate_per_s,
        help="beacons per second per client address")
    add("--probe-burst", type=int, default=_DEFAULTS.probe_burst,
        help="beacons a client address may send at once")
    add("--no-tracing", action="store_true",
        help="no stage records, spans or request metrics (the A/B baseline)")
    add("--no-ui", action="store_true", help="do not serve /ui, /demo and /probe/*.js")
    add("--log-format", choices=("auto", "json", "console"), default="auto")


def observability_settings_from_args(args: argparse.Namespace) -> ObservabilitySettings:
    origins = tuple(o.strip() for value in args.cors_origin for o in value.split(",")
                    if o.strip())
    return ObservabilitySettings(
        tracing=not args.no_tracing, trace_store_capacity=args.trace_store_capacity,
        cors_origins=origins, max_body_bytes=args.max_body_bytes,
        probe_max_bytes=args.probe_max_bytes, probe_rate_per_s=args.probe_rate_per_s,
        probe_burst=args.probe_burst, ui=not args.no_ui)
