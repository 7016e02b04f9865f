"""`python -m tracer trace export`: recorded requests as Mooncake JSONL, for replay tools.

    python -m tracer trace export --log server.log -o trace.jsonl
    python -m tracer trace export --url http://127.0.0.1:8000 --minutes 30 > trace.jsonl

One JSON object a line, oldest first: `timestamp` (ms from the first request), `input_length`
and `output_length` (tokens), `hash_ids` (one integer a `--block-size`-token block of the
prompt; equal ids, an equal prefix). The fields, their sources and how close the proxy's
blocks are: docs/reference.md, "Trace export (Mooncake JSONL)". The requests come from
`request_finished` log lines (`--log`) or a live server's `/ui/api/export` (`--url`), whose
rows are the same fields (tracer/web/ui_export.py), so both give the same lines.
Bad arguments or input, an unreachable server: a message on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Iterable, TextIO

from tracer.record import block_chain
from tracer.record.when import parse_when
from tracer.trace.fetch import bounded_int_arg, get_json

EXIT_OK, EXIT_INPUT = 0, 2
_TIMEOUT_S = 60.0
_MAX_MINUTES = block_chain.MAX_EXPORT_MINUTES


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--log", metavar="FILE",
                        help="a file of the server's JSON log lines ('-': stdin); its "
                             "request_finished lines are read, the others skipped")
    source.add_argument("--url", metavar="BASE_URL",
                        help="a live engine or proxy (its /ui/api/export)")
    parser.add_argument("--api-key", default=None, help="Bearer token of a live server")
    parser.add_argument("--minutes", type=_minutes, default=None, metavar="N",
                        help=f"with --url: the requests that arrived in the last N minutes "
                             f"(1 to {_MAX_MINUTES:,}; default "
                             f"{block_chain.DEFAULT_EXPORT_MINUTES})")
    parser.add_argument("--since", default=None, metavar="WHEN",
                        help="with --url: the requests that started from this time: an ISO "
                             "date and time (local unless it has an offset), unix ms, or a "
                             "time ago (15m, 2h, 7d); instead of --minutes")
    parser.add_argument("--until", default=None, metavar="WHEN",
                        help="with --url: ... and before this time (default now)")
    parser.add_argument("--block-size", type=_block_size,
                        default=block_chain.TOKENS_PER_BLOCK, metavar="TOKENS",
                        help=f"tokens a hash id stands for: a multiple of the recorded "
                             f"{block_chain.TOKENS_PER_BLOCK} (default "
                             f"{block_chain.TOKENS_PER_BLOCK}, as vLLM's and our engine's KV "
                             f"block; Mooncake's own traces use 512)")
    parser.add_argument("--with-text", action="store_true",
                        help="refused: the tracer never keeps prompt text, so there is none "
                             "to write")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="write here (default stdout)")


def run_export(args: argparse.Namespace, out: TextIO = sys.stdout,
               err: TextIO = sys.stderr) -> int:
    try:
        if args.with_text:
            raise ValueError("--with-text: the tracer drops each prompt once its diagnosis "
                             "and block chain are done and never stores its text, so no "
                             "record holds any to export; see "
                             'docs/reference.md, "Trace export (Mooncake JSONL)"')
        if args.log is not None:
            if (args.api_key, args.minutes, args.since, args.until) != (None,) * 4:
                raise ValueError("--api-key, --minutes, --since and --until are for --url")
            rows = list(_log_rows(args.log))
        else:
            rows = fetch_rows(args.url, args.minutes, args.api_key,
                              window_params(args.since, args.until, args.minutes))
        lines, skipped = mooncake_lines(rows, args.block_size)
        text = "".join(json.dumps(line, separators=(", ", ": ")) + "\n" for line in lines)
        if args.output is None:
            out.write(text)
        else:
            with open(args.output, "w", encoding="utf-8") as stream:
                stream.write(text)
    except (OSError, ValueError) as exc:
        print(f"tracer trace export: {exc}", file=err)
        return EXIT_INPUT
    note = f" ({skipped} without prompt or output tokens left out)" if skipped else ""
    print(f"tracer trace export: {len(lines)} requests{note}"
          + ("" if args.output is None else f" -> {args.output}"), file=err)
    return EXIT_OK


def mooncake_lines(rows: Iterable[dict], block_size: int) -> tuple[list[dict], int]:
    """The Mooncake objects of `rows` (log lines or /ui/api/export rows), oldest first, and
    how many rows were left out (no prompt or no output tokens: nothing to replay).

    `hash_ids` has ceil(input_length / block_size) ids. Digest i of a chain covers blocks
    0..i, so a block of k × 16 tokens is digest k·(i+1) − 1. Digests become integers in
    first-seen order; ids past the recorded chain (the prompt's partial last block, and
    blocks the chain does not reach) are fresh, shared with no other request: the engine
    never caches a partial block either.

    >>> chain = lambda n: block_chain.encode(block_chain.from_tokens(range(n)))
    >>> rows = [{"arrival_unix_ms": 1_000_500, "prompt_tokens": 40, "output_tokens": 3,
    ...          "prompt_blocks": chain(40), "trace_id": "b"},
    ...         {"arrival_unix_ms": 1_000_000, "prompt_tokens": 64, "output_tokens": 5,
    ...          "prompt_blocks": chain(64), "trace_id": "a"}]
    >>> mooncake_lines(rows, 16)[0]
    [{'timestamp': 0, 'input_length': 64, 'output_length': 5, 'hash_ids': [0, 1, 2, 3]}, \
{'timestamp': 500, 'input_length': 40, 'output_length': 3, 'hash_ids': [0, 1, 4]}]
    """
    step = block_size // block_chain.TOKENS_PER_BLOCK
    kept, skipped = [], 0
    for row in rows:
        parsed = _parsed(row)
        if parsed[1] < 1 or parsed[2] < 1:
            skipped += 1
        else:
            kept.append(parsed)
    kept.sort(key=lambda r: (r[0], r[4]))
    ids: dict[bytes, int] = {}
    fresh = itertools.count()
    lines = []
    for arrival_ms, num_in, num_out, chain, _ in kept:
        digests = [chain[8 * i:8 * i + 8] for i in range(step - 1, len(chain) // 8, step)]
        num_ids = -(-num_in // block_size)
        hash_ids = []
        for digest in digests[:num_in // block_size]:   # full blocks only
            if digest not in ids:
                ids[digest] = next(fresh)
            hash_ids.append(ids[digest])
        hash_ids.extend(next(fresh) for _ in range(num_ids - len(hash_ids)))
        lines.append({"timestamp": arrival_ms - kept[0][0], "input_length": num_in,
                      "output_length": num_out, "hash_ids": hash_ids})
    return lines, skipped


def _parsed(row: dict) -> tuple[int, int, int, bytes, str]:
    """(arrival ms, prompt tokens, output tokens, chain, trace id); ValueError naming the
    field a row lacks."""
    trace_id = row.get("trace_id") if isinstance(row.get("trace_id"), str) else ""
    values = []
    for key in ("arrival_unix_ms", "prompt_tokens", "output_tokens"):
        value = row.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"request {trace_id or '?'}: {key} is {value!r}, not a whole "
                             f"number (a log from before the export existed?)")
        values.append(value)
    try:
        chain = block_chain.decode(row.get("prompt_blocks"))
    except ValueError as exc:
        raise ValueError(f"request {trace_id or '?'}: {exc}") from None
    return values[0], values[1], values[2], chain, trace_id


def _log_rows(path: str) -> Iterable[dict]:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    with stream:
        for number, line in enumerate(stream, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue        # a console-rendered or foreign line: not ours to read
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if isinstance(obj, dict) and obj.get("event") == "request_finished":
                yield obj


def window_params(since: str | None, until: str | None, minutes: int | None) -> dict:
    """/ui/api/export's `from_unix_ms` / `to_unix_ms` of --since / --until.

    >>> window_params("1000", "2000", None)
    {'from_unix_ms': 1000, 'to_unix_ms': 2000}
    """
    if since is None and until is None:
        return {}
    if minutes is not None:
        raise ValueError("--minutes or --since/--until, not both")
    now_ms = int(time.time() * 1000)
    params = {}
    if since is not None:
        params["from_unix_ms"] = parse_when(since, now_ms)
    if until is not None:
        params["to_unix_ms"] = parse_when(until, now_ms)
    return params


def fetch_rows(base_url: str, minutes: int | None, api_key: str | None,
               window: dict | None = None) -> list[dict]:
    params = {} if minutes is None else {"minutes": minutes}
    params.update(window or {})
    url = f"{base_url.rstrip('/')}/ui/api/export"
    body = get_json(base_url, "/ui/api/export", params, api_key, timeout_s=_TIMEOUT_S)
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise ValueError(f"{url}: not an export (an object with a 'requests' list)")
    if body.get("num_more_requests"):
        print(f"tracer trace export: the server left out {body['num_more_requests']} older "
              f"requests (its bound on one answer)", file=sys.stderr)
    return [row if isinstance(row, dict) else {} for row in body["requests"]]


_minutes = bounded_int_arg(1, _MAX_MINUTES, "minutes")


def _block_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from None
    unit = block_chain.TOKENS_PER_BLOCK
    if value < unit or value % unit or value > 1 << 20:
        raise argparse.ArgumentTypeError(
            f"{value}: the chain is recorded in {unit}-token blocks, so a hash id can stand "
            f"for a multiple of {unit} tokens (up to {1 << 20:,}), not a finer or ragged block")
    return value
