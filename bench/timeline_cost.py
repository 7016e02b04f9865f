"""What `/ui/api/timeline` and a trace's neighbours cost at the store's bound.

    .venv/bin/python bench/timeline_cost.py [--requests 10000] [--trials 7]

Fills a server's trace store (built by `build_observability`, the composition root both
fronts use) with `--requests` finished records overlapping one another, attaches a full
step ring (8,192 steps of 16 requests each, what a busy engine keeps), then asks, through the
real ASGI app in-process:
- `/ui/api/timeline` for a window holding every record (the answer keeps the newest 2,000
  and counts the rest);
- `/ui/api/trace/<id>` of the newest record, whose neighbours are every other request;
Prints the median and max wall ms per answer, its size, and the peak Python memory of one
answer (tracemalloc), with the CPU named.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from instrumented_engine.engine.step_log import DEFAULT_STEP_LOG_SIZE, EngineStep, StepLog  # noqa: E402
from tracer.record.request_record import RequestRecord, StageSpan  # noqa: E402
from tracer.record.stages import SERVER_STAGES  # noqa: E402
from tracer.web.observability import ObservabilitySettings, build_observability  # noqa: E402

MS = 1_000_000


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def fill(obs, n: int, t0: int) -> list[RequestRecord]:
    records = []
    for i in range(n):
        start = t0 + i * MS                     # one arrival a ms, each lives 500 ms
        spans, t = [], start
        for stage in SERVER_STAGES:
            spans.append(StageSpan(stage, t, t + 10 * MS))
            t += 10 * MS
        record = RequestRecord(f"r{i}", f"{i + 1:032x}", f"{i + 1:016x}", "m", "chat", start,
                               start + 500 * MS, stages=tuple(spans), ttft_ns=t - start,
                               num_prompt_tokens=100 + i % 900, num_output_tokens=16)
        obs.store.put(record)
        records.append(record)
    return records


def steps_for(n: int, t0: int, span_ns: int) -> StepLog:
    log = StepLog(DEFAULT_STEP_LOG_SIZE)
    step_ns = span_ns // DEFAULT_STEP_LOG_SIZE
    for s in range(DEFAULT_STEP_LOG_SIZE):
        ids = tuple(f"r{(s * 7 + k) % n}" for k in range(16))
        log.append(EngineStep(t0 + s * step_ns, t0 + (s + 1) * step_ns, 64, 15, 0, ids,
                              (1,) * 15 + (64,)))
    return log


def timed(client: TestClient, url: str, params: dict, trials: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(trials):
        start = time.perf_counter()
        r = client.get(url, params=params)
        times.append((time.perf_counter() - start) * 1e3)
        assert r.status_code == 200, r.text
        size = len(r.content)
    return times, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    obs = build_observability(ObservabilitySettings(trace_store_capacity=args.requests),
                              model_names=("m",))
    t0 = time.perf_counter_ns() - (args.requests + 1000) * MS
    records = fill(obs, args.requests, t0)
    log = steps_for(args.requests, t0, (args.requests + 500) * MS)
    obs.neighbourhood.attach_steps(log.between, log.capacity)
    app = FastAPI()
    obs.include_routes(app)
    client = TestClient(app)
    newest = records[-1]
    whole = {"from_unix_ms": str(obs.clock.to_epoch_ns(t0) // MS - 1),
             "to_unix_ms": str(obs.clock.to_epoch_ns(newest.end_ns) // MS + 1)}
    print(f"CPU {cpu_name()}  {args.requests} records in the store, "
          f"{len(log)} steps of 16 requests in the ring, trials={args.trials}")
    for name, url, params in (("timeline, every record", "/ui/api/timeline", whole),
                              ("trace + neighbours", f"/ui/api/trace/{newest.trace_id}", {})):
        times, size = timed(client, url, params, args.trials)
        tracemalloc.start()
        client.get(url, params=params)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"  {name:24s} median {statistics.median(times):7.1f} ms  max {max(times):7.1f} ms"
              f"  answer {size / 1024:7.1f} KiB  peak {peak / 2**20:6.1f} MiB")
    obs.close()


if __name__ == "__main__":
    main()
