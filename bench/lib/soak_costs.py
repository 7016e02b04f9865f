"""What each structure the soak fills costs at its bound: tracemalloc, in this process.

Each structure is built empty, then filled past its bound (10 % more offered, so eviction
has run) with what the soak's own requests put there; the traced bytes still held after a
collection are its cost. Measured at the servers' default bounds, the ones a deployment
runs with, and scaled to the soak's smaller bounds. The KV pool is a tensor allocated and
zeroed at start (instrumented_engine/engine/model_runner.py), so its cost is its size,
resident before the first request: layers × 2 × KV heads × head dim × dtype bytes per token,
from the packaged model's GGUF header and the CPU's dtype (the engine's `/v1/models`).
The tracer worker's queue is not filled by the soak: it holds records only while its sinks
fall behind, and a full one makes the serving thread wait (record_worker.py), which no
steady soak can hold; its records are the store's own, by reference.
"""
from __future__ import annotations

import asyncio
import gc
import json
import random
import tracemalloc

from prometheus_client import CollectorRegistry

from bench.lib.soak_fill import BLOCK_SIZE, prompt
from instrumented_engine.engine.block_manager import BlockManager
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.engine.step_log import EngineStep, StepLog
from tracer.core.diagnoser import Diagnoser
from tracer.core.request_tracer import Tracer
from tracer.proxy.engine_join import DEFAULT_MAX_PENDING, EngineJoin, JoinSettings
from tracer.record.baselines import DEFAULT_WINDOW
from tracer.record.prompt_overlap import RECENT_PIECES
from tracer.record.stages import PROXY_STAGES
from tracer.sinks.engine_timing import EngineTimingMetrics
from tracer.sinks.store import TraceStore

MODEL = "m"
MS = 1_000_000
DEFAULT_STORE = 10_000   # tracer/web/server_options.py's trace_store_capacity


def held(fill) -> tuple[int, object]:
    """Bytes `fill()` leaves allocated (its result kept alive while measured)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def _active(tracer: Tracer, i: int):
    """A proxied request as the soak sends it: five stages, first token, its prompt body."""
    active = tracer.begin(request_id=f"soak-{i}", model=MODEL, operation="chat",
                          traceparent=None, start_ns=i * 100 * MS)
    t0 = i * 100 * MS
    for stage, at in (("receive", 0.2), ("upstream_connect", 0.3), ("upstream_ttfb", 2),
                      ("upstream_first_token", 60), ("send", 60.05)):
        active.timeline.mark(stage, t0 + int(at * MS))
    active.timeline.emit(t0 + 60 * MS + 50_000)
    active.prompt_source = json.dumps({"model": MODEL, "stream": True, "messages": [
        {"role": "user", "content": prompt(0, i)}]}).encode()   # the proxy keeps the raw body
    return active


FINISH = dict(end_ns=0, finish_reason="stop", num_prompt_tokens=300, num_output_tokens=64)


def store_cost(n: int) -> int:
    store = TraceStore(capacity=n)
    tracer = Tracer(model_names=(MODEL,), sinks=(store,), stages=PROXY_STAGES)

    def fill():
        for i in range(n + n // 10):
            active = _active(tracer, i)
            active.prompt_source = None   # the diagnosis drops it once judged
            tracer.finish(active, **{**FINISH, "end_ns": i * 100 * MS + 900 * MS})
        return store
    return held(fill)[0]


def join_cost(n: int) -> int:
    tracer = Tracer(model_names=(MODEL,), stages=PROXY_STAGES)

    async def run() -> int:
        join = EngineJoin(tracer, EngineTimingMetrics(CollectorRegistry()),
                          JoinSettings(wait_s=3600, max_pending=n, spans_expected=True))

        def fill():
            for i in range(n + n // 10):
                active = _active(tracer, i)
                join.expect(active)
                join.finish(active, **{**FINISH, "end_ns": i * 100 * MS + 900 * MS})
            return join
        used = held(fill)[0]
        assert join.num_pending == n
        join.close()
        return used
    return asyncio.run(run())


def step_log_cost(n: int, streams: int = 8) -> int:
    def fill():
        log = StepLog(n)
        ids = [f"cmpl-{random.getrandbits(96):024x}" for _ in range(streams)]
        for i in range(n + n // 10):
            if i % 64 == 0:   # a new request every 64 decode steps, as at --max-tokens 64
                ids[i // 64 % streams] = f"cmpl-{random.getrandbits(96):024x}"
            log.append(EngineStep(i, i + 1, 0, streams, 0, tuple(ids), (1,) * streams))
        return log
    return held(fill)[0]


def prefix_cache_cost(num_blocks: int) -> int:
    manager = BlockManager(num_blocks, BLOCK_SIZE)   # the blocks exist before any request
    rng = random.Random(0)

    def fill():
        for i in range(2 * num_blocks // 20 + 1):   # 20 blocks a sequence, the pool twice
            seq = Sequence(f"s{i}", [rng.randrange(49152) for _ in range(20 * BLOCK_SIZE)],
                           SamplingParams(), block_size=BLOCK_SIZE)
            manager.lookup(seq)
            assert manager.allocate_slots(seq, seq.num_tokens)
            seq.num_computed_tokens = seq.num_tokens
            manager.commit(seq)
            manager.free(seq)
        assert manager.num_cached_blocks == num_blocks
        return manager
    return held(fill)[0]


def diagnosis_cost() -> int:
    tracer = Tracer(model_names=(MODEL,), stages=PROXY_STAGES)
    diagnoser = Diagnoser()

    def fill():
        for i in range(max(4 * RECENT_PIECES // 32, 2 * DEFAULT_WINDOW)):
            record = tracer.finish(_active(tracer, i), **{**FINISH, "end_ns": i * 100 * MS
                                                          + 900 * MS})
            diagnoser.publish(record)
        return diagnoser
    return held(fill)[0]


def kv_bytes_per_token(dtype: str) -> int | None:
    """Per token of the packaged model's KV cache; None where it cannot be read."""
    try:
        import gguf
        from instrumented_engine.model.loader import default_model_path
        fields = gguf.GGUFReader(default_model_path()).fields
        meta = {name: f.contents() for name, f in fields.items() if name.startswith("llama.")}
        heads = int(meta["llama.attention.head_count"])
        head_dim = int(meta.get("llama.attention.key_length",
                                int(meta["llama.embedding_length"]) // heads))
        kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
        size = {"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2}.get(dtype, 4)
        return int(meta["llama.block_count"]) * 2 * kv_heads * head_dim * size
    except Exception:   # noqa: BLE001 (another model or format: the row says unknown)
        return None


def _row(name: str, bound: int, unit: str, used: int, soak_bound: int | None) -> None:
    each = used / bound
    soak = "" if soak_bound is None else (f"; at the soak's {soak_bound:,}: "
                                          f"{each * soak_bound / 2**20:.2f} MiB")
    print(f"cost at bound: {name:32s} {bound:>7,} {unit:8s} {used / 2**20:8.2f} MiB "
          f"({each:,.0f} B each{soak})", flush=True)


def print_costs(args, dtype: str | None = None) -> None:
    """One line per structure of `args.target`, each at its default bound."""
    _row("trace store", DEFAULT_STORE, "records", store_cost(DEFAULT_STORE),
         args.trace_store_capacity)
    used = diagnosis_cost()
    print(f"cost at bound: {'diagnosis (pieces + baselines)':32s} {RECENT_PIECES:>7,} pieces "
          f"  {used / 2**20:8.2f} MiB (one model, {DEFAULT_WINDOW} values a series; at most "
          "64 models)", flush=True)
    if args.target == "proxy":
        _row("engine join (parked)", DEFAULT_MAX_PENDING, "records",
             join_cost(DEFAULT_MAX_PENDING), args.join_max_pending)
        return
    config = EngineConfig()
    _row("engine step log", config.step_log_size, "steps", step_log_cost(config.step_log_size),
         args.step_log_size)
    _row("prefix cache (hashes)", config.num_kv_blocks, "blocks",
         prefix_cache_cost(config.num_kv_blocks), args.num_kv_blocks)
    if dtype is not None:
        per_token = kv_bytes_per_token(dtype)
        if per_token is not None:
            _row(f"KV pool ({dtype}, preallocated)", config.num_kv_blocks, "blocks",
                 per_token * BLOCK_SIZE * config.num_kv_blocks, args.num_kv_blocks)
