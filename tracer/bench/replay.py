"""`tracer bench --replay trace.jsonl`: a Mooncake trace sent again at its recorded offsets,
each request joined to the server's own record of it by trace id.

Schedule: one start instant, and each request due at start + timestamp × time_scale. The
scheduler waits for each absolute deadline (never a sleep between sends, whose errors would
add up), so a late send does not delay the next one. Send lag = when the request was handed
to the HTTP client − when it was due; its p50/p99/max are in the result.

Join: every traced response names its trace in `Server-Timing` (docs/reference.md, "W3C Trace
Context and Server-Timing"); after the run, `GET /ui/api/trace/<id>` gives that request's
stages, cached tokens and the verdict's cause (docs/reference.md, "TTFT verdicts"). A server
that sends no Server-Timing (llama-server on its own) leaves `server` null.
"""
from __future__ import annotations

import asyncio
import hashlib
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tracer.bench.mooncake import (
    TraceRequest,
    length_fields,
    load_trace,
    repeated_prefix_blocks,
    request_body,
)
from tracer.bench.runner import BenchConfig, make_client, send_request
from tracer.bench.stats import RequestResult, percentile, summarize
from tracer.record.traceparent import parse_server_timing

RESULT_KIND = "ttftscope.replay"
RESULT_VERSION = 1
# The scheduler wakes this early and spins the rest: asyncio's timer fires up to a loop
# iteration late, and the send lag bound (docs/reference.md, "Trace replay") is 5 ms.
_WAKE_EARLY_S = 0.002


@dataclass(slots=True, frozen=True)
class ReplayConfig:
    """One replay: where to send, how, and how the trace's clock maps to ours.

    Example:
        config = ReplayConfig(trace_path="trace.jsonl", base_url="http://127.0.0.1:8000",
                              model="smollm2", endpoint="completions")
        result = asyncio.run(run_replay(config))
        print(result["send_lag_ms"]["p99"])
    """

    trace_path: str
    base_url: str
    model: str
    endpoint: str = "completions"
    server: str = "ttftscope"
    time_scale: float = 1.0
    block_size: int = 16
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 60.0
    clock_ns: Callable[[], int] = field(default=time.perf_counter_ns, repr=False)

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError("time_scale must be > 0")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        length_fields(self.server, self.endpoint, 1)   # validates server and endpoint

    def bench_config(self, num_requests: int) -> BenchConfig:
        return BenchConfig(base_url=self.base_url, model=self.model, endpoint=self.endpoint,
                           num_requests=num_requests, concurrency=num_requests,
                           api_key=self.api_key, timeout_s=self.timeout_s,
                           clock_ns=self.clock_ns)


async def _wait_until(deadline_ns: int, clock_ns: Callable[[], int]) -> None:
    """Return at `deadline_ns`: sleep most of the way, then yield until it is reached."""
    while (left_ns := deadline_ns - clock_ns()) > 0:
        early = left_ns / 1e9 - _WAKE_EARLY_S
        await asyncio.sleep(early if early > 0 else 0)   # 0: let the streams run meanwhile


async def _send_all(config: ReplayConfig, requests: list[TraceRequest],
                    bodies: list[dict]) -> tuple[list[RequestResult], list[int], list[dict]]:
    bench = config.bench_config(len(requests))
    headers: list[dict] = [{} for _ in requests]
    async with make_client(bench) as client:
        start_ns = config.clock_ns()
        due_ns = [start_ns + round(r.timestamp_ms * config.time_scale * 1e6) for r in requests]
        tasks = []
        for i, body in enumerate(bodies):
            await _wait_until(due_ns[i], config.clock_ns)
            tasks.append(asyncio.create_task(send_request(client, bench, i, body, headers[i])))
        results = list(await asyncio.gather(*tasks))
    return results, due_ns, headers


async def _server_view(client: httpx.AsyncClient, config: ReplayConfig,
                       trace_id: str | None) -> dict | None:
    """The server's record of one request, reduced to what compare reads."""
    if trace_id is None:
        return None
    url = config.base_url.rstrip("/").removesuffix("/v1") + f"/ui/api/trace/{trace_id}"
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    view = response.json()
    verdict = view.get("verdict") or {}
    return {"ttft_ms": view.get("server_ttft_ms"), "source": view.get("source"),
            "num_prompt_tokens": view.get("num_prompt_tokens"),
            "num_cached_tokens": view.get("num_cached_tokens"),
            "stages_ms": {s["stage"]: s["duration_ms"] for s in view.get("stages", ())},
            "unattributed_ms": view.get("unattributed_ms"), "cause": verdict.get("cause")}


async def _join(config: ReplayConfig, trace_ids: list[str | None]) -> list[dict | None]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), trust_env=False) as c:
        return [await _server_view(c, config, t) for t in trace_ids]


def _trace_id(headers: dict) -> str | None:
    traceparent = parse_server_timing(headers.get("server-timing"))
    return traceparent.split("-")[1] if traceparent else None


def lag_stats(lags_ms: list[float]) -> dict:
    return {"p50": percentile(lags_ms, 50), "p99": percentile(lags_ms, 99), "max": max(lags_ms)}


async def run_replay(config: ReplayConfig) -> dict:
    """Replay the trace; the result document (`--out`), JSON-ready."""
    requests = load_trace(config.trace_path, config.block_size)
    bodies = [request_body(r, model=config.model, endpoint=config.endpoint,
                           server=config.server, block_size=config.block_size,
                           seed=config.seed) for r in requests]
    started_unix_s = time.time()
    results, due_ns, headers = await _send_all(config, requests, bodies)
    trace_ids = [_trace_id(h) for h in headers]
    views = await _join(config, trace_ids)
    repeated = repeated_prefix_blocks(requests)
    lags_ms = [(res.sent_ns - due) / 1e6 for res, due in zip(results, due_ns)]
    rows = []
    for i, (req, res) in enumerate(zip(requests, results)):
        row = res.to_row()
        del row["itl_ms"]    # the per-gap list would dominate the file; TPOT summarises it
        row.update(line=req.line, timestamp_ms=req.timestamp_ms,
                   scheduled_ms=(due_ns[i] - due_ns[0]) / 1e6, send_lag_ms=lags_ms[i],
                   input_length=req.input_length, output_length=req.output_length,
                   num_hash_ids=len(req.hash_ids), repeated_prefix_blocks=repeated[i],
                   trace_id=trace_ids[i], server=views[i],
                   cause=None if views[i] is None else views[i]["cause"])
        rows.append(row)
    return {
        "kind": RESULT_KIND, "version": RESULT_VERSION,
        "metadata": {
            "trace": str(config.trace_path), "trace_sha256": _sha256(config.trace_path),
            "num_requests": len(requests), "base_url": config.base_url, "model": config.model,
            "endpoint": config.endpoint, "server": config.server,
            "length_fields": sorted(length_fields(config.server, config.endpoint, 1)),
            "time_scale": config.time_scale, "block_size": config.block_size,
            "seed": config.seed, "started_unix_s": started_unix_s,
            "client": {"python": platform.python_version(), "machine": platform.machine()},
            "num_joined": sum(v is not None for v in views)},
        "send_lag_ms": lag_stats(lags_ms),
        "summary": summarize(results),
        "requests": rows,
    }


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
