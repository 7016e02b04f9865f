"""Prints a load run's summary as vLLM's aligned result table and writes the JSON report."""
from __future__ import annotations

import json
import os
from pathlib import Path

from tracer.bench.stats import PERCENTILES

_WIDTH = 50
_SECTIONS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2e", "E2EL", "End-to-end Latency"),
)


def _line(label: str, value) -> str:
    if value is None:
        shown = "n/a"
    elif isinstance(value, float):
        shown = f"{value:.2f}"
    else:
        shown = str(value)
    return f"{label:<40} {shown:<10}"  # vLLM's "{:<40} {:<10}"


def _rule(title: str = "", fill: str = "-") -> str:
    return f" {title} ".center(_WIDTH, fill) if title else fill * _WIDTH


def format_table(summary: dict) -> str:
    """The summary as an aligned, vLLM-style text table.

    Example:
        print(format_table(result.summary))
    """
    lines = [
        _rule("Serving Benchmark Result", "="),
        _line("Successful requests:", summary["completed"]),
        _line("Failed requests:", summary["failed"]),
    ]
    lines += [_line(f"  {kind}:", n) for kind, n in summary["failed_by_kind"].items()]
    lines += [
        _line("Benchmark duration (s):", summary["duration_s"]),
        _line("Total input tokens:", summary["total_input_tokens"]),
        _line("Total generated tokens:", summary["total_output_tokens"]),
        _line("Request throughput (req/s):", summary["request_throughput_rps"]),
        _line("Output token throughput (tok/s):", summary["output_throughput_tok_s"]),
        _line("Total Token throughput (tok/s):", summary["total_token_throughput_tok_s"]),
    ]
    for metric, short, title in _SECTIONS:
        lines.append(_rule(title))
        lines.append(_line(f"Mean {short} (ms):", summary[f"mean_{metric}_ms"]))
        lines += [_line(f"P{q} {short} (ms):", summary[f"p{q}_{metric}_ms"]) for q in PERCENTILES]
    lines.append(_rule(fill="="))
    return "\n".join(lines)


def write_json(report: dict, path: str | os.PathLike) -> Path:
    """Write `report` (e.g. `BenchResult.to_json()`) as JSON, creating parent folders."""
    out_path = Path(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # allow_nan=False: a NaN or inf would make the file unreadable to strict JSON parsers.
    out_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return out_path
