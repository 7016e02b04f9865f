"""bench/tool_call_grammar_cost.py runs end to end: both arms' ms per token over interleaved
rounds, the grammar's cost per token against unconstrained decoding, and the CPU it ran on."""
from __future__ import annotations

import re

from tests.bench_script import run_bench_script


def test_tool_call_grammar_cost_prints_both_arms_and_the_cost_per_token():
    out = run_bench_script("tool_call_grammar_cost.py", "--quick", "--max-tokens", "12",
                           timeout_s=600)
    assert re.search(r"^machine: .+, avx512f \w+, torch \S+", out, re.MULTILINE), out
    header = re.search(r"(\d+) output tokens, (\d+) rounds interleaved", out)
    assert header and 0 < int(header.group(1)) <= 12 and int(header.group(2)) >= 5, out
    for arm in ("unconstrained", "constrained"):
        row = re.search(rf"^  {arm}\s+median\s+([\d.]+) ms/token", out, re.MULTILINE)
        assert row and float(row.group(1)) > 0, out
    assert re.search(r"^  grammar cost\s+median\s+-?[\d.]+ ms/token", out, re.MULTILINE), out
    work = re.search(r"in-step grammar work median\s+([\d.]+) us/token", out)
    assert work and float(work.group(1)) > 0, out
