"""`python -m tracer <subcommand>`: a small dispatcher, one function per subcommand.

Example:
    python -m tracer bench --base-url http://127.0.0.1:8000 --model smollm2 \\
        --concurrency 4 --num-requests 100 --output-json out.json
    python -m tracer proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:8100
    python -m tracer collect --listen 127.0.0.1:8200 --beacon-key "$TTFTSCOPE_BEACON_KEY"
    python -m tracer diagnose --url http://127.0.0.1:8000 --minutes 15
    python -m tracer trace perfetto --url http://127.0.0.1:8000 --trace-id ID -o window.json
    python -m tracer bench --base-url http://127.0.0.1:8000 --model smollm2 \\
        --replay trace.jsonl --out after.json
    python -m tracer compare before.json after.json --fail-if-worse ttft@p95:5
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable


def _bench(args: argparse.Namespace) -> int:
    from tracer.bench.cli import run_bench_command
    return run_bench_command(args)


def _add_bench(subparsers) -> None:
    from tracer.bench.cli import add_bench_arguments
    parser = subparsers.add_parser("bench", help="load generator with vLLM bench serve metrics")
    add_bench_arguments(parser)
    parser.set_defaults(handler=_bench)


def _proxy(args: argparse.Namespace) -> int:
    from tracer.proxy.cli import run_proxy_command
    return run_proxy_command(args)


def _add_proxy(subparsers) -> None:
    from tracer.proxy.cli import add_proxy_arguments
    parser = subparsers.add_parser(
        "proxy", help="streaming reverse proxy that traces TTFT in front of any "
                      "OpenAI-compatible server (vLLM, SGLang, llama.cpp, ...)")
    add_proxy_arguments(parser)
    parser.set_defaults(handler=_proxy)


def _collect(args: argparse.Namespace) -> int:
    from tracer.collect.cli import run_collect_command
    return run_collect_command(args)


def _add_collect(subparsers) -> None:
    from tracer.collect.cli import add_collect_arguments
    parser = subparsers.add_parser(
        "collect", help="standalone beacon collector: /v1/probe, client metrics on /metrics, "
                        "client spans over OTLP (no model, no upstream)")
    add_collect_arguments(parser)
    parser.set_defaults(handler=_collect)


def _diagnose(args: argparse.Namespace) -> int:
    from tracer.diagnose.cli import run_diagnose_command
    return run_diagnose_command(args)


def _add_diagnose(subparsers) -> None:
    from tracer.diagnose.cli import add_diagnose_arguments
    parser = subparsers.add_parser(
        "diagnose", help="rank a window's TTFT causes, with the change each needs, from a "
                         "request_finished log or a live server; a CI gate")
    add_diagnose_arguments(parser)
    parser.set_defaults(handler=_diagnose)


def _compare(args: argparse.Namespace) -> int:
    from tracer.compare.cli import run_compare_command
    return run_compare_command(args)


def _add_compare(subparsers) -> None:
    from tracer.compare.cli import add_compare_arguments
    parser = subparsers.add_parser(
        "compare", help="two trace replays before and after a change: each stage, TTFT and "
                        "TPOT at p50/p95/p99 with bootstrap intervals, the causes; a CI gate")
    add_compare_arguments(parser)
    parser.set_defaults(handler=_compare)


def _trace(args: argparse.Namespace) -> int:
    from tracer.trace.cli import run_trace_command
    return run_trace_command(args)


def _add_trace(subparsers) -> None:
    from tracer.trace.cli import add_trace_arguments
    parser = subparsers.add_parser(
        "trace", help="export a window of requests and engine steps from a live server or "
                      "a saved timeline: perfetto (Chrome Trace Event JSON)")
    add_trace_arguments(parser)
    parser.set_defaults(handler=_trace)


def build_parser(prog: str = "python -m tracer", description: str | None = None,
                 extra: tuple[Callable[[argparse._SubParsersAction], None], ...] = ()
                 ) -> argparse.ArgumentParser:
    """The tracer's commands; `extra` adds more (the `ttftscope` command's `serve`)."""
    parser = argparse.ArgumentParser(prog=prog,
                                     description=description or __doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in extra:
        add(subparsers)
    _add_bench(subparsers)
    _add_proxy(subparsers)
    _add_collect(subparsers)
    _add_diagnose(subparsers)
    _add_trace(subparsers)
    _add_compare(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
