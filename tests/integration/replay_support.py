"""A synthetic Mooncake trace for the replay tests: a 20/60/20 short/medium/long mix, shared
prefixes (a system prompt most requests share, a document the long ones share, follow-ups
that extend an earlier first turn) and one burst of requests due at the same instant."""
from __future__ import annotations

import json
import random
from pathlib import Path

BLOCK = 16


def synthetic_trace(num_requests: int = 40, gap_ms: float = 300.0, burst_at: int = 20,
                    burst_size: int = 6, seed: int = 7, shared_blocks: int = 8) -> list[dict]:
    # Small on purpose: its replays must finish in about a minute each on two shared cores.
    rng = random.Random(seed)
    # Long shared prefixes and short own tails: a cache hit then removes most of a prompt,
    # an effect that stands out of a loaded machine's noise in the prefill stage.
    system = list(range(shared_blocks))                     # shared by medium and long prompts
    document = list(range(shared_blocks, 2 * shared_blocks))   # more shared by the long ones
    next_id = 2 * shared_blocks
    kinds = ["short"] * (num_requests // 5) + ["long"] * (num_requests // 5)
    kinds += ["medium"] * (num_requests - len(kinds))
    rng.shuffle(kinds)
    lines, t_ms, earlier_medium = [], 0.0, []
    for i, kind in enumerate(kinds):
        if kind == "short":
            prefix, num_tokens = [], rng.randint(16, 40)
        elif kind == "medium":
            follow_up = earlier_medium and rng.random() < 0.3
            prefix = list(rng.choice(earlier_medium)) if follow_up else list(system)
            num_tokens = len(prefix) * BLOCK + rng.randint(8, 24)
        else:
            prefix = system + document
            num_tokens = len(prefix) * BLOCK + rng.randint(8, 24)
        num_blocks = -(-num_tokens // BLOCK)
        fresh = list(range(next_id, next_id + num_blocks - len(prefix)))
        next_id += len(fresh)
        hash_ids = prefix + fresh
        if kind == "medium" and not follow_up:   # a follow-up of a first turn, not a chain
            earlier_medium.append(hash_ids[:num_tokens // BLOCK])   # whole blocks only
        lines.append({"timestamp": round(t_ms), "input_length": num_tokens,
                      "output_length": rng.randint(1, 2), "hash_ids": hash_ids})
        # The burst: burst_size requests share one timestamp.
        if not burst_at <= i < burst_at + burst_size - 1:
            t_ms += rng.expovariate(1 / gap_ms)
    return lines


def write_trace(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
