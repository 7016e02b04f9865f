"""What constrained decoding costs per token: one interleaved run.

    .venv/bin/python bench/tool_call_grammar_cost.py [--rounds 7] [--quick]

Two arms on one engine, the same prompt and the same number of output tokens, greedy:
- constrained: a tool call's arguments, an object of six string fields (`FIELDS`), cut at
  `--max-tokens` or ended when the grammar closes the object: N tokens, the same N every
  round (greedy);
- unconstrained: `ignore_eos`, `max_tokens` N, so it is N tokens long too.
(A schema that forces a length by itself, such as a string's `minLength: 4000`, is no
measure of a tool call: llguidance's lexer then costs ~30 ms a token on this CPU.)
The arms alternate (A B, then B A, ...), so drift on a shared machine hits both alike. Each
round times every decode step (the first token's step, the prefill, is left out) and takes
their median; the rounds' medians give the median and the spread (min-max). Beside the
end-to-end difference, the grammar's own work inside the step (computing the token mask,
applying it to the logits, feeding the token to the matcher) is timed directly.
The CPU is named (bench/lib/machine.py): the cost is per token on this CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.lib import machine  # noqa: E402
from instrumented_engine.engine import grammar as grammar_module  # noqa: E402
from instrumented_engine.engine import sampler as sampler_module  # noqa: E402
from instrumented_engine.engine.config import EngineConfig  # noqa: E402
from instrumented_engine.engine.llm_engine import LLMEngine  # noqa: E402
from instrumented_engine.engine.sampling import SamplingParams  # noqa: E402
from instrumented_engine.model.loader import load_model  # noqa: E402

FIELDS = ("city", "country", "summary", "history", "food", "weather")
SCHEMA = json.dumps({"type": "object", "properties": {f: {"type": "string"} for f in FIELDS},
                     "required": list(FIELDS), "additionalProperties": False})
PROMPT = [{"role": "user", "content": "Describe Paris: its history, food and weather."}]


class GrammarClock:
    """Sums the time spent in the grammar's two calls per token (wrapped in place)."""

    def __init__(self) -> None:
        self.mask_ns = self.accept_ns = 0
        mask, accept = sampler_module.mask_logits, grammar_module.Grammar.accept

        def timed_mask(*args):
            start = time.perf_counter_ns()
            try:
                return mask(*args)
            finally:
                self.mask_ns += time.perf_counter_ns() - start

        def timed_accept(grammar, token_id):
            start = time.perf_counter_ns()
            try:
                return accept(grammar, token_id)
            finally:
                self.accept_ns += time.perf_counter_ns() - start
        sampler_module.mask_logits = timed_mask
        grammar_module.Grammar.accept = timed_accept


def decode_step_ms(engine: LLMEngine, ids: list[int], sampling: SamplingParams,
                   num_tokens: int | None = None) -> tuple[float, int]:
    """One request alone: the median wall time of its decode steps (ms), and its tokens."""
    engine.add_request("bench", ids, sampling)
    steps, produced = [], 0
    while engine.has_unfinished():
        start = time.perf_counter()
        outs = engine.step()
        elapsed = time.perf_counter() - start
        if produced:                      # the first token's step is the prefill
            steps.append(elapsed)
        produced += sum(o.num_new_tokens for o in outs)
    assert num_tokens in (None, produced), f"{produced} tokens, expected {num_tokens}"
    return statistics.median(steps) * 1e3, produced


def spread(values: list[float], unit: str, digits: int = 2) -> str:
    return (f"median {statistics.median(values):8.{digits}f} {unit}  "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="N: the constrained answer's tokens, or fewer if it closes first")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    args = parser.parse_args()
    rounds = 5 if args.quick else max(5, args.rounds)
    torch.set_num_threads(args.threads)
    info = machine.describe(sys.executable)
    print(f"machine: {info['cpu_model']}, avx512f {info['avx512f']}, torch "
          f"{info['torch_cpu_capability']}, {args.threads} threads")
    engine = LLMEngine(EngineConfig(num_kv_blocks=256), loaded=load_model(None))
    ids = engine.tokenize(engine.render_chat(PROMPT), add_bos=False)
    clock = GrammarClock()
    constrained = SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                                 json_schema=SCHEMA)
    # Warm-up (the token trie is built), and the constrained answer's length N.
    _, num_tokens = decode_step_ms(engine, ids, constrained)
    arms = {"unconstrained": SamplingParams(temperature=0.0, max_tokens=num_tokens,
                                            ignore_eos=True), "constrained": constrained}
    clock.mask_ns = clock.accept_ns = 0
    ms = {name: [] for name in arms}
    in_step_us: list[float] = []
    for r in range(rounds):
        for name in (arms if r % 2 == 0 else reversed(arms)):
            before = clock.mask_ns + clock.accept_ns
            ms[name].append(decode_step_ms(engine, ids, arms[name], num_tokens)[0])
            if name == "constrained":
                in_step_us.append((clock.mask_ns + clock.accept_ns - before) / num_tokens / 1e3)
    print(f"tool-call grammar cost  {num_tokens} output tokens, {rounds} rounds interleaved, "
          f"greedy, llguidance")
    for name in arms:
        print(f"  {name:<14} {spread(ms[name], 'ms/token')}")
    diffs = [c - u for c, u in zip(ms["constrained"], ms["unconstrained"])]
    share = statistics.median(diffs) / statistics.median(ms["unconstrained"]) * 100
    print(f"  grammar cost   {spread(diffs, 'ms/token')}  ({share:+.1f}%)")
    total = clock.mask_ns + clock.accept_ns
    print(f"  in-step grammar work {spread(in_step_us, 'us/token', 1)}  (mask "
          f"{100 * clock.mask_ns / total:.0f}%, accept {100 * clock.accept_ns / total:.0f}%)")


if __name__ == "__main__":
    main()
