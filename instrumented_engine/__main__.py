"""`python -m instrumented_engine serve`: the engine behind its OpenAI-compatible server."""
from __future__ import annotations

import argparse
import sys
import threading


def _parser(prog: str = "python -m instrumented_engine") -> argparse.ArgumentParser:
    # Config and CLI options only: the parser must not pay for importing torch.
    from instrumented_engine.engine.config import EngineConfig
    from instrumented_engine.model.format_names import DTYPE_CHOICES, WEIGHT_FORMAT_CHOICES
    from tracer.web.cli_options import add_observability_arguments

    defaults = EngineConfig()
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API with stage tracing")
    serve.add_argument("--model", default=None,
                       help="GGUF file or Hugging Face directory (default: the packaged SmolLM2)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-num-batched-tokens", type=int, default=512,
                       help="chunked-prefill token budget per step")
    serve.add_argument("--max-num-seqs", type=int, default=64)
    long_prefill = "docs/architecture.md, \"Long prompts share the step\""
    serve.add_argument("--long-prefill-token-threshold", type=int,
                       default=defaults.long_prefill_token_threshold,
                       help="a prompt with more uncomputed tokens is long: at most this many "
                            f"per step, so shorter ones start beside it (0: off; {long_prefill})")
    serve.add_argument("--max-num-partial-prefills", type=int,
                       default=defaults.max_num_partial_prefills,
                       help="prompts a step may leave mid-prefill")
    serve.add_argument("--max-long-partial-prefills", type=int,
                       default=defaults.max_long_partial_prefills,
                       help="long prompts a step may leave mid-prefill; one over it waits "
                            "while shorter ones start")
    serve.add_argument("--num-kv-blocks", type=int, default=defaults.num_kv_blocks,
                       help=f"KV blocks of {defaults.block_size} tokens")
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument("--device", default="auto")
    serve.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                       help="activations and KV cache (auto: chosen for the CPU's capability, "
                            "bf16 on a GPU)")
    serve.add_argument("--weight-format", default="auto", choices=WEIGHT_FORMAT_CHOICES,
                       help="CPU matmul weights (auto: weight-only int4/int8 for decode plus "
                            "oneDNN bf16 or fp32, chosen for the CPU's capability; "
                            "docs/reference.md, \"Engine weight formats\")")
    serve.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    serve.add_argument("--step-log-size", type=int, default=defaults.step_log_size,
                       help="engine steps kept for the timeline and the neighbours of a slow "
                            "request (0: none; docs/reference.md, \"Timeline and neighbours\")")
    serve.add_argument("--no-warmup", action="store_true",
                       help="serve without the warm-up passes and the CUDA graph capture that "
                            "follows them (/health is ready at once)")
    serve.add_argument("--enforce-eager", action="store_true",
                       help="on CUDA, run every decode step eagerly: no CUDA graphs (the CPU "
                            "never captures; docs/reference.md, \"Engine readiness\")")
    add_observability_arguments(serve)   # the flags `tracer proxy` has too
    serve.add_argument("--open", action="store_true",
                       help="open /demo and /ui in a browser once the server answers")
    return parser


def _open_when_ready(base_url: str, timeout_s: float = 120.0) -> None:
    """Open the demo and the UI once /health answers (on a machine with a browser)."""
    import time
    import webbrowser

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url + "/health", timeout=1.0).status_code == 200:
                webbrowser.open(base_url + "/demo")
                webbrowser.open(base_url + "/ui")
                return
        except httpx.HTTPError:
            time.sleep(0.2)


def serve(args: argparse.Namespace) -> None:

    from instrumented_engine.engine.config import EngineConfig
    from instrumented_engine.engine.llm_engine import LLMEngine
    from instrumented_engine.model.cpu_formats import CpuFormatError
    from instrumented_engine.server.app import ServerSettings, create_app
    from tracer.sinks.logs import configure_logging
    from tracer.web.cli_options import connection_limits_from_args, observability_settings_from_args
    from tracer.web.server_options import run_server

    config = EngineConfig(model=args.model, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks,
                          long_prefill_token_threshold=args.long_prefill_token_threshold,
                          max_num_partial_prefills=args.max_num_partial_prefills,
                          max_long_partial_prefills=args.max_long_partial_prefills,
                          max_model_len=args.max_model_len,
                          enable_prefix_caching=not args.no_prefix_caching,
                          device=args.device, dtype=args.dtype, weight_format=args.weight_format,
                          num_threads=args.num_threads, step_log_size=args.step_log_size,
                          enforce_eager=args.enforce_eager)
    try:
        engine = LLMEngine(config)
    except CpuFormatError as exc:     # a format this CPU cannot run: say what to use instead
        sys.exit(f"error: {exc}")
    from tracer.store.open import describe_store
    from tracer.store.schema import StoreError
    try:
        settings = ServerSettings(observability=observability_settings_from_args(args),
                                  warm_up=not args.no_warmup, http_spans=args.http_spans)
        parts = create_app(engine, settings, logger=configure_logging(args.log_format))
    except (StoreError, ValueError) as exc:   # a store that cannot be used, a bad retention
        sys.exit(f"error: {exc}")
    base_url = f"http://{args.host}:{args.port}"
    runtime = engine.loaded.describe()
    print(f"serving {engine.model_name} on {base_url} "
          f"(UI: /ui, chat demo: /demo, metrics: /metrics)\n"
          f"  records kept in {describe_store(parts.obs.store)}\n"
          f"  runs on {runtime['device']}: " + ", ".join(
              f"{key} {'+'.join(map(str, v)) if isinstance(v, list) else v}"
              for key, v in runtime.items() if key != "device") +
          f"\n  decode steps: {engine.decode_graphs.describe()}", file=sys.stderr, flush=True)
    if args.open:
        threading.Thread(target=_open_when_ready, args=(base_url,), daemon=True).start()
    run_server(parts.app, host=args.host, port=args.port,
               limits=connection_limits_from_args(args), timeout_graceful_shutdown=5)


def main(argv: list[str] | None = None, prog: str = "python -m instrumented_engine") -> None:
    args = _parser(prog).parse_args(argv)
    if args.command == "serve":
        serve(args)


if __name__ == "__main__":
    main()
