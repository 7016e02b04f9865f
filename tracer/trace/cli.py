"""`python -m tracer trace <format>`: a window of requests and engine steps, for other tools.

    python -m tracer trace perfetto --url http://127.0.0.1:8000 --trace-id ID -o window.json
    python -m tracer trace perfetto --url http://127.0.0.1:8100 \\
        --from 2025-06-01T12:00:00Z --to 2025-06-01T12:05:00Z -o window.json
    python -m tracer trace perfetto --in timeline.json > window.json
    python -m tracer trace export --log server.log -o trace.jsonl    (tracer/trace/export.py)

The window is a live server's `GET /ui/api/timeline` (`--url`: that request's interval widened
by `--pad-ms` each side, or `--from`/`--to`, at most an hour) or a file holding such an answer
(`--in`); docs/reference.md, "Timeline and neighbours". Each format is one subcommand in
`FORMATS`: a pure function from that JSON to the text it writes (`perfetto`: Chrome Trace
Event JSON from `tracer.record.chrome_trace`), the window's arguments shared. Bad arguments,
an unreachable server, an answer that is not a timeline: a message on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, TextIO

from tracer.record.chrome_trace import chrome_trace
from tracer.record.window_limits import DEFAULT_PAD_MS, MAX_PAD_MS, MAX_WINDOW_MS
from tracer.trace.export import add_export_arguments, run_export
from tracer.trace.fetch import bounded_int_arg, get_json

EXIT_OK, EXIT_INPUT = 0, 2
# Before 1973 in ms, but now in seconds: the likelier mistake, refused rather than guessed.
_MIN_UNIX_MS, _MAX_UNIX_MS = 10**11, 10**15
_TIMEOUT_S = 30.0
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


EXPORT_HELP = ("recorded requests as Mooncake JSONL (timestamp, input_length, "
               "output_length, hash_ids), from a request_finished log or a live server")


@dataclass(frozen=True)
class Format:
    help: str
    render: Callable[[dict], str]     # the timeline JSON -> the text written


def _perfetto(timeline: dict) -> str:
    return json.dumps(chrome_trace(timeline), separators=(",", ":")) + "\n"


FORMATS: dict[str, Format] = {
    "perfetto": Format("Chrome Trace Event JSON: open it at https://ui.perfetto.dev or in "
                       "chrome://tracing", _perfetto),
}


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    formats = parser.add_subparsers(dest="trace_format", metavar="FORMAT", required=True)
    for name, spec in FORMATS.items():
        sub = formats.add_parser(name, help=spec.help, description=spec.help)
        _add_window_arguments(sub)
        sub.set_defaults(trace_render=spec.render)
    # Not a window of one timeline but the recorded requests: its own arguments and run.
    export = formats.add_parser("export", help=EXPORT_HELP, description=EXPORT_HELP)
    add_export_arguments(export)
    export.set_defaults(trace_run=run_export)


def _add_window_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", metavar="BASE_URL",
                        help="a live engine or proxy (its /ui/api/timeline)")
    source.add_argument("--in", dest="in_file", metavar="TIMELINE_JSON",
                        help="a file holding a /ui/api/timeline answer ('-': stdin)")
    parser.add_argument("--api-key", default=None, help="Bearer token of a live server")
    parser.add_argument("--trace-id", type=trace_id, default=None, metavar="ID",
                        help="the window: this request's server interval (32 hex digits)")
    parser.add_argument("--pad-ms", type=pad_ms, default=None, metavar="P",
                        help=f"with --trace-id: widen its interval by P ms each side "
                             f"(0 to {MAX_PAD_MS:,}; default {DEFAULT_PAD_MS:,})")
    parser.add_argument("--from", dest="from_ms", type=unix_ms, default=None, metavar="A",
                        help="the window's start: unix ms or ISO-8601 (no offset: UTC)")
    parser.add_argument("--to", dest="to_ms", type=unix_ms, default=None, metavar="B",
                        help="the window's end, likewise; at most an hour after --from")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="write here (default stdout)")


def run_trace_command(args: argparse.Namespace, out: TextIO = sys.stdout,
                      err: TextIO = sys.stderr) -> int:
    if getattr(args, "trace_run", None) is not None:
        return args.trace_run(args, out, err)
    name = f"tracer trace {args.trace_format}"
    try:
        if args.in_file is not None:
            _check_file_arguments(args)
            timeline = _from_file(args.in_file)
        else:
            timeline = fetch_timeline(args.url, window_params(args), args.api_key)
        text = args.trace_render(timeline)
        if args.output is None:
            out.write(text)
        else:
            with open(args.output, "w", encoding="utf-8") as stream:
                stream.write(text)
    except (OSError, ValueError) as exc:
        print(f"{name}: {exc}", file=err)
        return EXIT_INPUT
    print(f"{name}: {summary(timeline)}" + ("" if args.output is None else f" -> {args.output}"),
          file=err)
    return EXIT_OK


def window_params(args: argparse.Namespace) -> dict:
    """The /ui/api/timeline query for --trace-id [--pad-ms] or --from --to; ValueError else."""
    by_time = args.from_ms is not None or args.to_ms is not None
    if args.trace_id is not None and by_time:
        raise ValueError("give --trace-id or --from/--to, not both")
    if args.trace_id is not None:
        pad = DEFAULT_PAD_MS if args.pad_ms is None else args.pad_ms
        return {"trace_id": args.trace_id, "pad_ms": pad}
    if args.pad_ms is not None:
        raise ValueError("--pad-ms widens a --trace-id window; --from/--to say the window")
    if args.from_ms is None or args.to_ms is None:
        raise ValueError("the window: give --trace-id ID, or both --from A and --to B")
    if args.to_ms <= args.from_ms:
        raise ValueError("--to must be after --from")
    if args.to_ms - args.from_ms > MAX_WINDOW_MS:
        raise ValueError(f"the window is {(args.to_ms - args.from_ms) / 60_000:g} minutes; "
                         f"the server answers at most 60")
    return {"from_unix_ms": args.from_ms, "to_unix_ms": args.to_ms}


def fetch_timeline(base_url: str, params: dict, api_key: str | None) -> dict:
    body = get_json(base_url, "/ui/api/timeline", params, api_key, timeout_s=_TIMEOUT_S)
    return checked_timeline(body, f"{base_url}/ui/api/timeline")


def checked_timeline(body, source: str) -> dict:
    """`body` when it has a timeline's shape; the converters tolerate bad fields inside."""
    if not (isinstance(body, dict) and isinstance(body.get("requests"), list)
            and isinstance(body.get("steps"), list)):
        raise ValueError(f"{source}: not a timeline (an object with 'requests' and 'steps' "
                         f"lists)")
    return body


def summary(timeline: dict) -> str:
    """One line for stderr: what the window held, and what the server left out."""
    text = f"{len(timeline['requests'])} requests, {len(timeline['steps'])} engine steps"
    more = [f"{n} more {what}" for what in ("requests", "steps")
            if isinstance(n := timeline.get(f"num_more_{what}"), int) and n > 0]
    return text + (f" (left out by the server's limit: {', '.join(more)})" if more else "")


def trace_id(text: str) -> str:
    text = text.strip().lower()
    if not _TRACE_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a trace id (32 hex digits)")
    return text


pad_ms = bounded_int_arg(0, MAX_PAD_MS, "ms")


def unix_ms(text: str) -> int:
    """Unix ms, or an ISO-8601 time (without an offset: UTC), as unix ms.

    >>> unix_ms("1700000000000"), unix_ms("2023-11-14T22:13:20Z"), unix_ms("2023-11-14 22:13:20")
    (1700000000000, 1700000000000, 1700000000000)
    """
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or not _MIN_UNIX_MS <= value < _MAX_UNIX_MS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: unix time in ms expected (before 1973: seconds? or past year 30000)")
        return round(value)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither unix ms nor an ISO-8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round(when.timestamp() * 1000)


def _check_file_arguments(args: argparse.Namespace) -> None:
    given = [flag for flag, value in (("--trace-id", args.trace_id), ("--pad-ms", args.pad_ms),
                                      ("--from", args.from_ms), ("--to", args.to_ms),
                                      ("--api-key", args.api_key)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: for --url; --in reads a window already cut")


def _from_file(path: str) -> dict:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    with stream:
        try:
            body = json.load(stream)
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from exc
    return checked_timeline(body, path)
