"""The soak's warm-up: the prompts it sends, and whether each bounded structure is full.

Every check reads the server itself (`/metrics`, `/ui/api/requests`), never a count the
client kept: a request the client counted may not have reached a structure (a cut stream
has no first token, so no verdict; a record parked in the engine join is not in the store
yet). Where a structure's fill cannot be read directly, the check reads the counter that
only moves once it is full, or a lower bound on what went through it:

- trace store: `/ui/api/requests?limit=1000` lists exactly its capacity (so the soak's
  capacity is at most 1,000).
- engine join (proxy): the join waits a day (`--engine-join-wait-s`), so a record leaves the
  table early, as a `timeout`, only when the table is full
  (`llm_engine_timing_total{source="none",outcome="timeout"}` > 0).
- step log (engine): forward passes, `llm_engine_step_seconds_count` summed, reach its size
  (a deque of that many: every slot written).
- KV pool and prefix cache (engine): the free list is FIFO (block_manager.py), so the first
  N allocations take N distinct blocks; tokens written to KV (prompt − cached + generated)
  over the block size is a lower bound on allocations, and it must reach twice the pool,
  with cached tokens > 0 (the prompts' shared head hits the cache).
- recent prompt pieces (diagnosis): each prompt has `PROMPT_LINES` lines no other prompt
  has, so verdicts (`llm_ttft_cause_total` summed) × `PROMPT_LINES` distinct pieces went
  into a per-model index of `RECENT_PIECES`; twice that proves it reached its bound.
- baselines (diagnosis): each verdict adds one value to the model's series; verdicts reach
  the series window (`baselines.DEFAULT_WINDOW`).
"""
from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tracer.record.baselines import DEFAULT_WINDOW
from tracer.record.prompt_overlap import MIN_PIECE_CHARS, RECENT_PIECES

BLOCK_SIZE = 16            # instrumented_engine/engine/config.py, EngineConfig.block_size
PROMPT_LINES = 32          # lines of a prompt that no other prompt has (pieces, see above)
MAX_LISTED = 1000          # /ui/api/requests' largest `limit`
JOIN_WAIT_S = 86_400       # the proxy's --engine-join-wait-s in the soak: see the docstring
# Three lines every prompt shares: about 40 tokens, two full KV blocks after the chat
# template's own head, which later prompts find in the prefix cache.
SHARED_HEAD = ("You are the soak client's assistant and you answer in one short sentence.\n"
               "Keep to the facts you are sure of, and say so when you are not sure.\n"
               "Each numbered line below is a separate question about the same topic.\n")


def prompt(worker: int, n: int) -> str:
    """Request `n` of `worker`: the shared head, then `PROMPT_LINES` lines of its own."""
    lines = [f"w{worker} n{n} q{k}: one fact?" for k in range(PROMPT_LINES)]
    assert all(len(line) >= MIN_PIECE_CHARS for line in lines)   # each is a piece
    return SHARED_HEAD + "\n".join(lines)


@dataclass
class Fill:
    name: str
    bound: str             # the bound, in words ("200 records")
    progress: str          # what the server says now
    full: bool


def scrape(client: httpx.Client) -> list[tuple[str, dict, float]]:
    text = client.get("/metrics").text
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def total(samples, name: str, **labels) -> float:
    return sum(value for n, lab, value in samples
               if n == name and all(lab.get(k) == v for k, v in labels.items()))


def fills(client: httpx.Client, target: str, bounds: dict) -> list[Fill]:
    """Each bounded structure of `target` and whether the server reports it full."""
    samples = scrape(client)
    listed = len(client.get("/ui/api/requests", params={"limit": MAX_LISTED}).json()["requests"])
    capacity = bounds["trace_store_capacity"]
    verdicts = int(total(samples, "llm_ttft_cause_total"))
    out = [Fill("trace store", f"{capacity} records", f"{listed} listed", listed == capacity)]
    if target == "proxy":
        early = int(total(samples, "llm_engine_timing_total", source="none", outcome="timeout"))
        out.append(Fill("engine join (parked records)", f"{bounds['join_max_pending']} records",
                        f"{early} published early (table full)", early > 0))
    else:
        steps = int(total(samples, "llm_engine_step_seconds_count"))
        size = bounds["step_log_size"]
        out.append(Fill("engine step log", f"{size} steps", f"{steps} steps taken", steps >= size))
        written = (total(samples, "llm_prompt_tokens_total")
                   - total(samples, "llm_prompt_cached_tokens_total")
                   + total(samples, "llm_generation_tokens_total"))
        cached = int(total(samples, "llm_prompt_cached_tokens_total"))
        blocks = bounds["num_kv_blocks"]
        cycled = written / BLOCK_SIZE / blocks
        out.append(Fill("KV pool and prefix cache", f"{blocks} blocks of {BLOCK_SIZE} tokens",
                        f"pool written {cycled:.1f}x, {cached} prompt tokens from the cache",
                        cycled >= 2 and cached > 0))
    pieces = verdicts * PROMPT_LINES
    out.append(Fill("diagnosis: recent prompt pieces", f"{RECENT_PIECES} pieces",
                    f"{pieces} distinct pieces judged", pieces >= 2 * RECENT_PIECES))
    out.append(Fill("diagnosis: baselines", f"{DEFAULT_WINDOW} values a series",
                    f"{verdicts} verdicts", verdicts >= DEFAULT_WINDOW))
    return out


def kv_usage(client: httpx.Client) -> float:
    """`llm_kv_cache_usage_ratio` now (engine only)."""
    return total(scrape(client), "llm_kv_cache_usage_ratio")
