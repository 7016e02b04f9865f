"""`ttftscope <command>`: `serve` runs the instrumented engine (`python -m instrumented_engine
serve`); every other command is the tracer's (`python -m tracer <command>`), with the same
arguments.

It lives above both packages because the tracer never imports the engine (.importlinter,
"tracer never imports instrumented_engine"): a proxy-only install (`pip install ttftscope`,
no torch) must run every command but `serve`, and `serve` then says which extra it needs.

    ttftscope serve --port 8000
    ttftscope proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:8100
"""
from __future__ import annotations

import argparse
import sys

PROG = "ttftscope"
# What `serve` imports beyond the base install: the `engine` extra in pyproject.toml (less
# anyio, which the base install has through starlette).
ENGINE_EXTRA_MODULES = frozenset({"torch", "gguf", "tokenizers", "jinja2", "safetensors",
                                  "numpy"})


def _add_serve(subparsers) -> None:
    # Listed for `ttftscope --help` only: `main` hands `serve` and its arguments to the
    # engine's own parser before this parser runs, so its options are defined in one place.
    subparsers.add_parser("serve", add_help=False,
                          help="the instrumented engine behind its OpenAI-compatible server "
                               "(SmolLM2-135M-Instruct by default; needs the engine extra)")


def _serve(argv: list[str]) -> int:
    try:
        from instrumented_engine.__main__ import main as engine_main
        engine_main(["serve", *argv], prog=PROG)
    except ModuleNotFoundError as exc:
        if exc.name not in ENGINE_EXTRA_MODULES:
            raise
        print(f"{PROG} serve: the engine needs {exc.name!r}, which is not installed: "
              f"pip install 'ttftscope[engine]' (the proxy and the other commands run "
              f"without it)", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    from tracer.__main__ import build_parser
    parser = build_parser(prog=PROG, extra=(_add_serve,), description=(
        "Where did the time before the first token go? Stage-by-stage TTFT tracing for LLM "
        "serving: the engine (serve), a tracing proxy in front of yours (proxy), the "
        "browser beacons' collector (collect) and the tools around them."))
    args = parser.parse_args(argv)
    return args.handler(args)
