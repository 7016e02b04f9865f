"""`python -m tracer bench --replay TRACE.jsonl`: options checked, the replay run, its table."""
from __future__ import annotations

import argparse
import asyncio
import sys

from tracer.bench.replay import ReplayConfig, run_replay
from tracer.bench.report import format_table, write_json
from tracer.record.stages import SERVER_STAGES

# Options of the synthetic load that a replay would ignore: the trace sets the shape,
# lengths and prompts, so setting one is refused rather than silently dropped.
_SYNTHETIC_DEFAULTS = {"concurrency": None, "request_rate": None, "burstiness": 1.0,
                       "num_requests": None, "warmup": 0, "prompt_tokens": 256,
                       "shared_prefix_ratio": 0.0, "output_tokens": 64}


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    for option, default in _SYNTHETIC_DEFAULTS.items():
        if getattr(args, option) != default:
            raise ValueError(f"--{option.replace('_', '-')} does not apply to --replay: "
                             "the trace sets the load")
    return ReplayConfig(
        trace_path=args.replay, base_url=args.base_url, model=args.model,
        endpoint=args.endpoint or "completions", server=args.server or "ttftscope",
        time_scale=1.0 if args.time_scale is None else args.time_scale,
        block_size=16 if args.block_size is None else args.block_size,
        seed=args.seed, api_key=args.api_key, timeout_s=args.timeout_s)


def format_replay(result: dict) -> str:
    """The run's table, its send lag, and the server's median stage times."""
    lag = result["send_lag_ms"]
    lines = [format_table(result["summary"]),
             f"{'Send lag p50 / p99 / max (ms):':<40} "
             f"{lag['p50']:.2f} / {lag['p99']:.2f} / {lag['max']:.2f}",
             f"{'Joined to the server record:':<40} {result['metadata']['num_joined']}"
             f" of {result['metadata']['num_requests']}"]
    views = [r["server"] for r in result["requests"] if r["server"]]
    stages = [s for s in SERVER_STAGES if any(s in v["stages_ms"] for v in views)]
    stages += sorted({s for v in views for s in v["stages_ms"]} - set(stages))
    for stage in stages:
        values = sorted(v["stages_ms"][stage] for v in views if stage in v["stages_ms"])
        lines.append(f"{'  median ' + stage + ' (ms):':<40} {values[len(values) // 2]:.2f}")
    return "\n".join(lines)


def run_replay_command(args: argparse.Namespace) -> int:
    """0 when at least one request completed, 1 when none did, 2 on bad input."""
    try:
        config = config_from_args(args)
        result = asyncio.run(run_replay(config))
    except (ValueError, OSError) as exc:
        print(f"bench --replay: {exc}", file=sys.stderr)
        return 2
    print(format_replay(result))
    if args.output_json:
        print(f"wrote {write_json(result, args.output_json)}", file=sys.stderr)
    return 0 if result["summary"]["completed"] > 0 else 1
