"""bench/long_prefill.py --quick runs end to end: two of our servers (the long-prefill knob off
and on), one round of a long prompt then a short one, and the summary it prints."""
from __future__ import annotations

import pathlib
import re
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_script import run_bench_script  # noqa: E402

SPREAD = r"[\d.]+ \([\d.]+-[\d.]+\)"   # median (min-max)


def test_quick_run_prints_both_configurations_targets_and_the_cpu():
    out = run_bench_script("long_prefill.py", "--quick", timeout_s=420)
    assert "llama.cpp: skipped (--quick)" in out
    assert re.search(r"ours, knob off: .*--long-prefill-token-threshold 0", out), out
    for name in ("ours, knob off", "ours, knob on"):
        assert re.search(rf"^round 0  {name} +long +\d+ ms  short +\d+ ms  short/long [\d.]+  "
                         r"prompt tokens \d+/\d+$", out, re.M), out
        assert re.search(rf"^{name} +{SPREAD} +{SPREAD} +{SPREAD}$", out, re.M), out
    assert re.search(r"long prompt 6\d\d tokens, short 3\d tokens sent 200 ms later", out), out
    assert re.search(rf"^short/long, knob on: {SPREAD}  target <= 0.25: (met|missed)$", out,
                     re.M), out
    assert re.search(rf"^long TTFT on/off: {SPREAD}  target <= 1.1: (met|missed)$", out,
                     re.M), out
    assert re.search(r"^idle servers used [\d.]+ cores while another was measured$", out, re.M)
    assert f"torch capability {torch.backends.cpu.get_cpu_capability()}" in out
    assert out.rstrip().endswith("failed requests: 0")
