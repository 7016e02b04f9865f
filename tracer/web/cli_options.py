"""The command-line flags both fronts share (`instrumented_engine serve`, `tracer proxy`):
one name and one default per setting, read into one `ObservabilitySettings`."""
from __future__ import annotations

import argparse
import os

from tracer.web.limits import ConnectionLimits
from tracer.web.observability import ObservabilitySettings

_DEFAULTS = ObservabilitySettings()
_LIMITS = ConnectionLimits()


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
        help="finished requests kept in memory (the newest; the store keeps the rest)")
    add_store_arguments(parser)
    add("--probe-max-bytes", type=int, default=_DEFAULTS.probe_max_bytes,
        help="largest browser beacon accepted on /v1/probe")
    add("--probe-rate-per-s", type=float, default=_DEFAULTS.probe_rate_per_s,
        help="beacons per second per client address")
    add("--probe-burst", type=int, default=_DEFAULTS.probe_burst,
        help="beacons a client address may send at once")
    add("--no-tracing", action="store_true",
        help="no stage records, spans or request metrics (the A/B baseline)")
    add("--http-spans", action="store_true",
        help="also an HTTP SERVER span per request from OpenTelemetry's FastAPI "
             "instrumentation, our request span nested in it (docs/reference.md, \"Spans\")")
    add("--no-diagnosis", action="store_true",
        help="no TTFT verdicts (cause, excess, action): saves the tracer's worker its CPU")
    add("--no-ui", action="store_true", help="do not serve /ui, /demo and /probe/*.js")
    add("--log-format", choices=("auto", "json", "console"), default="auto")
    add("--api-key", default=os.environ.get("TTFTSCOPE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on all but /health, /metrics, /v1/probe, "
             "/demo, /probe/*.js and the /ui page (its data, /ui/api/*, needs it) "
             "(env TTFTSCOPE_API_KEY)")
    add("--beacon-key", default=os.environ.get("TTFTSCOPE_BEACON_KEY"),
        help="HMAC key of the beacon tokens in Server-Timing, shared with a standalone "
             "collector (env TTFTSCOPE_BEACON_KEY; default: random per process)")
    add("--forwarded-allow-ips",
        default=os.environ.get("FORWARDED_ALLOW_IPS", ",".join(_DEFAULTS.forwarded_allow_ips)),
        help="comma-separated IPs or CIDRs of proxies whose X-Forwarded-For names the client "
             "(the rightmost untrusted hop) for the beacon rate limit and logs; '*' trusts "
             "every peer, '' none (env FORWARDED_ALLOW_IPS, as uvicorn; default 127.0.0.1)")
    # Connection limits (tracer/web/limits.py), enforced before any request is routed.
    add("--max-header-bytes", type=int, default=_LIMITS.max_header_bytes,
        help=f"request line + headers above this get 431 (default {_LIMITS.max_header_bytes})")
    add("--header-timeout-s", type=float, default=_LIMITS.header_timeout_s,
        help="a request head must arrive within this many seconds of its first byte "
             f"(408 / close; default {_LIMITS.header_timeout_s:g})")
    add("--body-timeout-s", type=float, default=_LIMITS.body_timeout_s,
        help="longest wait for the next request body byte (408 / close; default "
             f"{_LIMITS.body_timeout_s:g})")
    add("--body-deadline-s", type=float, default=_LIMITS.body_deadline_s,
        help="a whole request body must arrive within this many seconds of its head, "
             f"however it trickles (408 / close; default {_LIMITS.body_deadline_s:g})")
    add("--max-client-connections", type=int, default=_LIMITS.max_connections,
        help="open client connections; one accepted beyond this gets 503 "
             f"(default {_LIMITS.max_connections})")
    add("--keep-alive-timeout-s", type=float, default=_LIMITS.keep_alive_timeout_s,
        help=f"idle keep-alive connections close after this (default "
             f"{_LIMITS.keep_alive_timeout_s:g})")


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """`--store`, `--data-dir` and retention: where finished records are kept
    (docs/reference.md, "The store")."""
    add = parser.add_argument
    add("--store", default=os.environ.get("TTFTSCOPE_STORE") or None, metavar="URL",
        help="where finished records are kept: memory, sqlite:///PATH or "
             "postgresql://USER@HOST:PORT/DB (also $TTFTSCOPE_STORE; default: an SQLite "
             "file in --data-dir)")
    add("--data-dir", default=os.environ.get("TTFTSCOPE_DATA_DIR") or None, metavar="DIR",
        help="the default SQLite store's folder (also $TTFTSCOPE_DATA_DIR; default "
             "$XDG_DATA_HOME/ttftscope, ~/.local/share/ttftscope)")
    add("--retention-days", type=float, default=_DEFAULTS.retention_max_age_s / 86400,
        help="stored records older than this are deleted (default %(default)g)")
    add("--retention-max-mb", type=float, default=_DEFAULTS.retention_max_bytes / 2**20,
        help="the store is kept under this size, the oldest records deleted first "
             "(default %(default)g; 0: no size bound)")


def store_settings_from_args(args: argparse.Namespace) -> dict:
    """The `ObservabilitySettings` fields of `add_store_arguments`' flags."""
    if args.retention_days <= 0 or args.retention_max_mb < 0:
        raise ValueError("--retention-days must be > 0 and --retention-max-mb >= 0")
    return {"store": args.store, "data_dir": args.data_dir,
            "retention_max_age_s": args.retention_days * 86400,
            "retention_max_bytes": int(args.retention_max_mb * 2**20) or None}


def observability_settings_from_args(args: argparse.Namespace) -> ObservabilitySettings:
    origins = tuple(o.strip() for value in args.cors_origin for o in value.split(",")
                    if o.strip())
    return ObservabilitySettings(
        tracing=not args.no_tracing, diagnosis=not args.no_diagnosis,
        trace_store_capacity=args.trace_store_capacity, **store_settings_from_args(args),
        cors_origins=origins, max_body_bytes=args.max_body_bytes,
        probe_max_bytes=args.probe_max_bytes, probe_rate_per_s=args.probe_rate_per_s,
        probe_burst=args.probe_burst, ui=not args.no_ui, api_key=args.api_key or None,
        beacon_key=args.beacon_key or None,
        forwarded_allow_ips=tuple(h.strip() for h in args.forwarded_allow_ips.split(",")
                                  if h.strip()))


def connection_limits_from_args(args: argparse.Namespace) -> ConnectionLimits:
    """The connection limits of `add_observability_arguments`' flags (ValueError when out
    of range)."""
    return ConnectionLimits(
        max_header_bytes=args.max_header_bytes, header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s, body_deadline_s=args.body_deadline_s,
        max_connections=args.max_client_connections,
        keep_alive_timeout_s=args.keep_alive_timeout_s)


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:8100') → (host, port), for `--listen` (proxy, collect).

    >>> parse_listen("127.0.0.1:8100"), parse_listen("[::1]:9000")
    (('127.0.0.1', 8100), ('::1', 9000))
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)
