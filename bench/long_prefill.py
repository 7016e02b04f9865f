"""A short prompt behind a long one's prefill: our engine with the long-prefill knob
off and on, and llama.cpp's `llama-server -np 2`, in one interleaved run.

    .venv/bin/python bench/long_prefill.py               # 3 rounds, ~4,000-token prompt
    .venv/bin/python bench/long_prefill.py --quick       # 1 round, ~600 tokens, ours only
    .venv/bin/python bench/long_prefill.py --chunk-sweep 128,256,512   # the cap's cost alone

Each trial sends a long prompt (chat, greedy, `--output-tokens` tokens), then a short one
`--gap-ms` later, each on its own connection, and takes both TTFTs from the streams (send ->
first content event, tracer.bench's definition). Every server gets the same prompts within a
round and fresh ones each round (no prefix-cache hit). The servers run side by side on the
same GGUF and threads: ours twice, `--long-prefill-token-threshold 0` (off) and with the
defaults (on; docs/architecture.md, "Long prompts share the step"), and llama-server with two
slots and continuous batching (as bench/vs_llamacpp.py finds and starts it; skipped, and
said so, where it is not installed). The order of the servers flips every round, so drift
of the machine hits them alike.

Prints, per server, medians over the rounds with their spread (min-max) of the long TTFT,
the short TTFT and short/long; the long TTFT on/off per round; the targets (short/long <=
0.25 with the knob on, long TTFT on/off <= 1.10); the CPU and how busy other processes kept it.

`--chunk-sweep` instead prefills the long prompt alone, in process, in chunks of each size
(the budget set to it), interleaved over the rounds: what the cap costs the long prompt in
matmul efficiency and in per-step work. Each step's time is the minimum over the rounds,
which other processes on the machine can only raise; their sum is the prefill's time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # bench.lib, when run as `python bench/long_prefill.py`

from bench.lib.loopback import free_port  # noqa: E402
from step_record_cost import cpu_name  # noqa: E402
from tracer.bench.prompts import PromptSpec, build_request_body, make_prompts  # noqa: E402
from tracer.bench.runner import BenchConfig, send_request  # noqa: E402
from tracer.bench.stats import RequestResult  # noqa: E402
from vs_llamacpp import (QUIET_OTHER_CORES, CpuMeter, Server, llama_server_argv,  # noqa: E402
                         llama_server_binary, llama_server_version, ours_argv, smollm2_gguf,
                         wait_ready)

OFF, ON, LLAMA = "ours, knob off", "ours, knob on", "llama.cpp -np 2"
KNOB_OFF_FLAGS = ("--long-prefill-token-threshold", "0")
TARGET_SHORT_OVER_LONG = 0.25
TARGET_LONG_GROWTH = 1.10


def prompt_body(model: str, num_words: int, seed: int, index: int, output_tokens: int) -> dict:
    prompt = make_prompts(PromptSpec(num_words, 0.0, seed), 1, first_index=index)[0]
    return build_request_body("chat", model, prompt, output_tokens)


async def trial(server: Server, long_body: dict, short_body: dict, gap_s: float,
                timeout_s: float) -> tuple[RequestResult, RequestResult]:
    """The long request, then the short one `gap_s` later; both read to their ends."""
    config = BenchConfig(base_url=server.url, model=server.model, timeout_s=timeout_s)
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s),
                                 trust_env=False) as client:
        long_task = asyncio.create_task(send_request(client, config, 0, long_body))
        await asyncio.sleep(gap_s)
        short = await send_request(client, config, 1, short_body)
        return await long_task, short


def run_trial(server: Server, args: argparse.Namespace, rnd: int, long_words: int,
              ) -> tuple[RequestResult, RequestResult]:
    """Round `rnd`'s prompts: the same on every server, fresh each round."""
    long_body = prompt_body(server.model, long_words, 1000 + rnd, rnd, args.output_tokens)
    short_body = prompt_body(server.model, args.short_words, 2000 + rnd, rnd, args.output_tokens)
    return asyncio.run(trial(server, long_body, short_body, args.gap_ms / 1e3, args.timeout_s))


# -- figures ---------------------------------------------------------------------------------

def spread(values: list[float], digits: int = 0, unit: str = "") -> str:
    """'median (min-max)'; '-' for no values."""
    if not values:
        return "-"
    f = f"{{:.{digits}f}}"
    return (f"{f.format(statistics.median(values))}{unit} "
            f"({f.format(min(values))}-{f.format(max(values))})")


def summary_rows(trials: dict[str, list[tuple[RequestResult, RequestResult]]],
                 ) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, pairs in trials.items():
        ok = [(lg, sh) for lg, sh in pairs if lg.ttft_s is not None and sh.ttft_s is not None]
        rows.append((name, spread([lg.ttft_s * 1e3 for lg, _ in ok]),
                     spread([sh.ttft_s * 1e3 for _, sh in ok]),
                     spread([sh.ttft_s / lg.ttft_s for lg, sh in ok], 2)))
    return rows


def long_growth(trials: dict) -> list[float]:
    """Long TTFT with the knob on / off, per round where both completed."""
    return [on[0].ttft_s / off[0].ttft_s for off, on in zip(trials[OFF], trials[ON])
            if on[0].ttft_s and off[0].ttft_s]


def format_table(rows: list[tuple[str, ...]]) -> str:
    head = ("server", "long TTFT ms", "short TTFT ms", "short/long")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in
                                                          zip(r[1:], widths[1:])])
                     for r in [head, *rows])


def report(trials: dict, prompt_tokens: dict, others_cores: float, num_rounds: int,
           args: argparse.Namespace) -> int:
    failed = sum(not r.ok for pairs in trials.values() for pair in pairs for r in pair)
    print(f"\nmedians (min-max) over {num_rounds} interleaved rounds; long prompt "
          f"{prompt_tokens['long']} tokens, short {prompt_tokens['short']} tokens sent "
          f"{args.gap_ms:g} ms later, {args.output_tokens} output tokens each")
    print(format_table(summary_rows(trials)))
    on_ratio = [sh.ttft_s / lg.ttft_s for lg, sh in trials[ON] if lg.ttft_s and sh.ttft_s]
    growth = long_growth(trials)
    for label, values, target in (("short/long, knob on", on_ratio, TARGET_SHORT_OVER_LONG),
                                  ("long TTFT on/off", growth, TARGET_LONG_GROWTH)):
        verdict = ("met" if values and statistics.median(values) <= target else "missed")
        print(f"{label}: {spread(values, 2)}  target <= {target:g}: {verdict}")
    print(f"CPU: {cpu_name()}, torch capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} threads a server; other processes used {others_cores:.2f} cores"
          + (" -- NOT QUIET" if others_cores > QUIET_OTHER_CORES else " (quiet)"))
    print(f"failed requests: {failed}")
    return 1 if failed else 0


# -- servers and rounds ----------------------------------------------------------------------

def start(name: str, argv: list[str], tmp: Path, procs: list) -> tuple[str, subprocess.Popen,
                                                                       Path]:
    port = free_port()
    argv = [*argv[:argv.index("--port") + 1], str(port), *argv[argv.index("--port") + 2:]]
    print(f"{name}: {' '.join(argv)}", flush=True)
    log = tmp / f"{len(procs)}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    procs.append(proc)
    return f"http://127.0.0.1:{port}", proc, log


def start_servers(args: argparse.Namespace, tmp: Path, procs: list) -> dict[str, Server]:
    gguf = smollm2_gguf()
    plans = {OFF: ours_argv(gguf, 0, args.threads) + list(KNOB_OFF_FLAGS),
             ON: ours_argv(gguf, 0, args.threads)}
    if args.quick:
        print("llama.cpp: skipped (--quick)")
    else:
        try:
            binary = llama_server_binary()
            print(f"llama-server: {binary}  {llama_server_version(binary)}", flush=True)
            plans[LLAMA] = llama_server_argv(binary, gguf, 0, args.threads, 2, args.ctx_size)
        except SystemExit as exc:      # not installed, or its libraries not linked
            print(f"llama.cpp: skipped, llama-server unavailable: {exc}")
    started = {name: start(name, argv, tmp, procs) for name, argv in plans.items()}
    return {name: Server(name, url, wait_ready(url, proc, log, args.startup_timeout_s),
                         psutil.Process(proc.pid))
            for name, (url, proc, log) in started.items()}


def run_rounds(servers: dict[str, Server], args: argparse.Namespace) -> tuple[dict, dict, float]:
    trials: dict[str, list] = {name: [] for name in servers}
    names = list(servers)
    for name in names:      # warm-up, excluded: first-request costs (a far-away round)
        run_trial(servers[name], args, 999, long_words=64)
    meter, others_s, idle_s, wall_s = CpuMeter(servers), 0.0, 0.0, 0.0
    tokens = {}
    for rnd in range(args.rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            before, start_s = meter.read(), time.monotonic()
            long, short = run_trial(servers[name], args, rnd, args.long_words)
            after = meter.read()
            others_s += CpuMeter.others_s(before, after)
            idle_s += sum(after[n] - before[n] for n in names if n != name)
            wall_s += time.monotonic() - start_s
            trials[name].append((long, short))
            tokens = {"long": long.prompt_tokens, "short": short.prompt_tokens}
            ratio = (f"{short.ttft_s / long.ttft_s:.2f}" if long.ttft_s and short.ttft_s
                     else "-")
            print(f"round {rnd}  {name:<16}  long {fmt_ms(long)}  short {fmt_ms(short)}  "
                  f"short/long {ratio}  prompt tokens {long.prompt_tokens}/"
                  f"{short.prompt_tokens}", flush=True)
    print(f"idle servers used {idle_s / wall_s:.2f} cores while another was measured")
    return trials, tokens, others_s / wall_s if wall_s else 0.0


def fmt_ms(result: RequestResult) -> str:
    if result.ttft_s is None:
        return f"FAILED ({result.error_kind})"
    return f"{result.ttft_s * 1e3:8.0f} ms"


def chunk_sweep(args: argparse.Namespace) -> int:
    from engine_bench import text_of_tokens
    from instrumented_engine.engine.config import EngineConfig
    from instrumented_engine.engine.llm_engine import LLMEngine
    from instrumented_engine.engine.sampling import SamplingParams
    from instrumented_engine.model.loader import load_model

    torch.set_num_threads(args.threads)
    loaded, sizes = load_model(None), [int(c) for c in args.chunk_sweep.split(",")]
    engines = {c: LLMEngine(EngineConfig(max_num_batched_tokens=c, long_prefill_token_threshold=0,
                                         enable_prefix_caching=False), loaded=loaded)
               for c in sizes}
    steps: dict[int, list[list[float]]] = {c: [] for c in sizes}
    num_tokens = args.long_words + 31      # the chat template's tokens, as served
    for rnd in range(args.rounds):
        for c in (sizes if rnd % 2 == 0 else sizes[::-1]):
            engine, times = engines[c], []
            engine.add_request("long", text_of_tokens(engine, num_tokens, salt=rnd),
                               SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
            while engine.has_unfinished():
                start_s = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start_s)
            steps[c].append(times)
            print(f"round {rnd}  chunk {c:4d}  {sum(times) * 1e3:8.0f} ms", flush=True)
    print(f"\n{num_tokens}-token prefill alone, {args.rounds} interleaved rounds")
    for c in sizes:
        minima = [min(step) for step in zip(*steps[c])]
        print(f"chunk {c:4d}: {len(minima):3d} steps, sum of per-step minima "
              f"{sum(minima) * 1e3:7.0f} ms, last step {minima[-1] * 1e3:5.0f} ms, runs "
              + spread([sum(t) * 1e3 for t in steps[c]], unit=" ms"))
    print(f"CPU: {cpu_name()}, torch capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{args.threads} threads")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--rounds", type=int, default=3)
    add("--threads", type=int, default=2, help="CPU threads of every server")
    add("--long-words", type=int, default=4034, help="~ tokens of the long prompt")
    add("--short-words", type=int, default=6, help="~ tokens of the short prompt's text")
    add("--gap-ms", type=float, default=200.0, help="the short request's delay")
    add("--output-tokens", type=int, default=4)
    add("--ctx-size", type=int, default=10240, help="llama-server's KV cache, both slots")
    add("--timeout-s", type=float, default=600.0, help="limit for each request")
    add("--startup-timeout-s", type=float, default=180.0)
    add("--quick", action="store_true", help="1 round, a ~600-token prompt, ours only")
    add("--chunk-sweep", metavar="SIZES", help="comma-separated chunk sizes: the long prompt "
        "alone, in process, in chunks of each size")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.long_words = 1, 600
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.chunk_sweep:
        return chunk_sweep(args)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="long-prefill-") as tmp:
        try:
            servers = start_servers(args, Path(tmp), procs)
            trials, tokens, others = run_rounds(servers, args)
            return report(trials, tokens, others, args.rounds, args)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
