"""Command-line options of `python -m tracer bench` and the function that runs them."""
from __future__ import annotations

import argparse
import asyncio
import math
import sys

from tracer.bench.endpoints import ENDPOINTS
from tracer.bench.mooncake import SERVER_KINDS
from tracer.bench.report import format_table, write_json
from tracer.bench.runner import BenchConfig, run_bench


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the bench options on `parser` (a subcommand parser)."""
    add = parser.add_argument
    add("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    add("--model", required=True, help="model name sent in each request")
    add("--endpoint", choices=tuple(ENDPOINTS), default=None,
        help="the API: OpenAI chat or completions, Anthropic messages, OpenAI responses "
             "(default chat; completions with --replay)")
    load = parser.add_argument_group("load shape (default: one request at a time)")
    load.add_argument("--concurrency", type=int, default=None, help="max requests in flight")
    load.add_argument("--request-rate", type=float, default=None,
                      help="mean arrivals per second (gamma intervals; Poisson at burstiness 1)")
    load.add_argument("--burstiness", type=float, default=1.0)
    add("--num-requests", type=int, default=None, help="required unless --replay")
    add("--warmup", type=int, default=0, help="requests run first and excluded from the stats")
    add("--prompt-tokens", type=int, default=256, help="approximate prompt length")
    add("--shared-prefix-ratio", type=float, default=0.0,
        help="share of each prompt identical across requests (0..1)")
    add("--output-tokens", type=int, default=64, help="max_tokens (with ignore_eos)")
    add("--api-key", default=None)
    add("--seed", type=int, default=0)
    add("--timeout-s", type=float, default=60.0, help="limit for each whole request")
    add("--output-json", "--out", default=None, help="write summary and per-request rows here")
    add("--no-progress", action="store_true", help="no progress bar on stderr")
    replay = parser.add_argument_group(
        "trace replay (docs/reference.md, \"Trace replay\"): the load shape and prompt "
        "options above do not apply")
    replay.add_argument("--replay", default=None, metavar="TRACE.jsonl",
                        help="send a Mooncake trace at its recorded offsets")
    replay.add_argument("--time-scale", type=float, default=None,
                        help="multiply the trace's offsets (0.5: twice as fast; default 1)")
    replay.add_argument("--block-size", type=int, default=None,
                        help="tokens per hash id (default 16)")
    replay.add_argument("--server", choices=tuple(SERVER_KINDS), default=None,
                        help="what the target accepts for an exact output length "
                             "(default ttftscope: our engine, or the proxy in front of it)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.num_requests is None:
        raise ValueError("--num-requests is required (unless --replay)")
    for option in ("time_scale", "block_size", "server"):
        if getattr(args, option) is not None:
            raise ValueError(f"--{option.replace('_', '-')} applies to --replay only")
    rate = args.request_rate
    return BenchConfig(
        base_url=args.base_url, model=args.model, endpoint=args.endpoint or "chat",
        num_requests=args.num_requests, concurrency=args.concurrency,
        request_rate=None if rate is None or math.isinf(rate) else rate,
        burstiness=args.burstiness, num_warmup=args.warmup,
        prompt_tokens=args.prompt_tokens, shared_prefix_ratio=args.shared_prefix_ratio,
        output_tokens=args.output_tokens, api_key=args.api_key, seed=args.seed,
        timeout_s=args.timeout_s, progress=not args.no_progress,
    )


def run_bench_command(args: argparse.Namespace) -> int:
    """Run the bench; exit status 0 when at least one request completed, else 1 (2 on
    bad options or an unreadable trace)."""
    if args.replay is not None:
        from tracer.bench.replay_cli import run_replay_command
        return run_replay_command(args)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    result = asyncio.run(run_bench(config))
    print(format_table(result.summary))
    if args.output_json:
        path = write_json(result.to_json(), args.output_json)
        print(f"wrote {path}", file=sys.stderr)
    return 0 if result.summary["completed"] > 0 else 1
