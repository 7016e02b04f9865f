"""The load generator: streams requests at an OpenAI-compatible server and measures them like vLLM.

`endpoint` picks the API (tracer/bench/endpoints.py): OpenAI chat or completions, Anthropic
Messages or the Responses API, where the server serves them.

Metric definitions (vLLM `bench serve`, with guidellm/aiperf's rule that role-only and usage-only
events are not tokens): TTFT = send → first event with text; ITL = every gap between content
events, pooled across requests; TPOT = (E2E − TTFT) / (output_tokens − 1); E2E = send → last
content event. Arrivals are Poisson by default (gamma intervals, burstiness 1), seeded.

The load is bounded: `num_requests` requests (plus `num_warmup`), each cut off after `timeout_s`.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tracer.bench.endpoints import ENDPOINTS
from tracer.bench.prompts import PromptSpec, build_request_body, make_prompts
from tracer.bench.stats import RequestResult, summarize
from tracer.bench.stream import StreamTimeline

ENDPOINT_PATHS = {name: e.path for name, e in ENDPOINTS.items()}
# The API version header Anthropic's Messages API requires (the @anthropic-ai/sdk default).
_ANTHROPIC_VERSION = "2023-06-01"
_MAX_ERROR_BODY_CHARS = 500


@dataclass(slots=True, frozen=True)
class BenchConfig:
    """One load run. Without `concurrency` and `request_rate`, requests go one at a time.

    `concurrency` caps requests in flight; `request_rate` (req/s) spaces arrivals with gamma
    intervals (`burstiness` 1 = Poisson). Both may be set: arrivals then also wait for a slot.

    Example:
        config = BenchConfig(base_url="http://127.0.0.1:8000", model="smollm2",
                             num_requests=50, concurrency=4, prompt_tokens=512,
                             shared_prefix_ratio=0.5, output_tokens=32)
        result = asyncio.run(run_bench(config))
        print(result.summary["p95_ttft_ms"])
    """

    base_url: str
    model: str
    endpoint: str = "chat"
    num_requests: int = 100
    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    num_warmup: int = 0
    prompt_tokens: int = 256
    shared_prefix_ratio: float = 0.0
    output_tokens: int = 64
    api_key: str | None = None
    seed: int = 0
    timeout_s: float = 60.0
    progress: bool = False
    clock_ns: Callable[[], int] = field(default=time.perf_counter_ns, repr=False, compare=False)

    def __post_init__(self) -> None:
        checks = [
            (self.endpoint in ENDPOINT_PATHS, f"endpoint must be one of {sorted(ENDPOINT_PATHS)}"),
            (self.num_requests >= 1, "num_requests must be >= 1"),
            (self.num_warmup >= 0, "num_warmup must be >= 0"),
            (self.concurrency is None or self.concurrency >= 1, "concurrency must be >= 1"),
            (self.request_rate is None or self.request_rate > 0, "request_rate must be > 0"),
            (self.burstiness > 0, "burstiness must be > 0"),
            (self.output_tokens >= 1, "output_tokens must be >= 1"),
            (self.timeout_s > 0, "timeout_s must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        PromptSpec(self.prompt_tokens, self.shared_prefix_ratio, self.seed)  # validates those

    @property
    def max_concurrency(self) -> int | None:
        """Requests in flight at most; None means arrivals alone pace the load."""
        if self.concurrency is not None:
            return self.concurrency
        return None if self.request_rate is not None and math.isfinite(self.request_rate) else 1

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        path = ENDPOINT_PATHS[self.endpoint]
        return base + (path.removeprefix("/v1") if base.endswith("/v1") else path)

    def to_json(self) -> dict:
        """The settings, for the report; the API key is never written out."""
        settings = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "clock_ns"}
        settings["api_key"] = None if self.api_key is None else "***"
        return settings


@dataclass(slots=True, frozen=True)
class BenchResult:
    """The measured requests of one run (warm-up excluded) and their summary.

    Example:
        result = asyncio.run(run_bench(config))
        json.dump(result.to_json(), open("out.json", "w"))
    """

    config: BenchConfig
    results: tuple[RequestResult, ...]
    duration_s: float
    summary: dict

    def to_json(self) -> dict:
        return {"config": self.config.to_json(), "summary": self.summary,
                "requests": [r.to_row() for r in self.results]}


def arrival_offsets_s(num_requests: int, request_rate: float | None, burstiness: float = 1.0,
                      seed: int = 0) -> list[float]:
    """When each request is due, relative to the start (vLLM: the first goes at once).

    Intervals are gamma(shape=burstiness, scale=1 / (rate * burstiness)): mean 1/rate, and a
    Poisson process when burstiness is 1. No rate (or inf) means all are due at once.
    """
    if request_rate is None or math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(f"{seed}:arrivals")
    scale_s = 1.0 / (request_rate * burstiness)
    offsets_s, now_s = [], 0.0
    for _ in range(num_requests):
        offsets_s.append(now_s)
        now_s += rng.gammavariate(burstiness, scale_s)
    return offsets_s


def _headers(config: BenchConfig) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    if config.endpoint == "messages":
        headers["anthropic-version"] = _ANTHROPIC_VERSION
        if config.api_key:
            headers["x-api-key"] = config.api_key
    return headers


async def _stream_one(client: httpx.AsyncClient, config: BenchConfig, body_bytes: bytes,
                      timeline: StreamTimeline, headers_out: dict | None = None) -> None:
    timeline.mark_sent()
    async with client.stream("POST", config.url, content=body_bytes, headers=_headers(config)) as response:
        if headers_out is not None:   # replay joins the server's record by its Server-Timing
            headers_out.update(response.headers)
        if response.status_code != 200:
            text = (await response.aread()).decode("utf-8", "replace")
            timeline.fail("http_error", text[:_MAX_ERROR_BODY_CHARS], response.status_code)
            return
        async for line in response.aiter_lines():
            timeline.feed_line(line)
            if timeline.is_closed:
                return


async def send_request(client: httpx.AsyncClient, config: BenchConfig, index: int,
                       body: dict, headers_out: dict | None = None) -> RequestResult:
    """Send one streaming request and time it; transport failures become a failed result.
    `headers_out`, when given, receives the response's headers (lower-case names)."""
    timeline = StreamTimeline(index, config.endpoint, config.clock_ns)
    body_bytes = json.dumps(body).encode()  # encoded before the clock starts
    try:
        async with asyncio.timeout(config.timeout_s):
            await _stream_one(client, config, body_bytes, timeline, headers_out)
    except (TimeoutError, httpx.TimeoutException):
        timeline.fail("timeout", f"no complete response within {config.timeout_s} s")
    except httpx.ConnectError as exc:
        timeline.fail("connect_error", str(exc))
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        timeline.fail("broken_stream", str(exc) or type(exc).__name__)
    except httpx.HTTPError as exc:
        timeline.fail("transport_error", f"{type(exc).__name__}: {exc}")
    return timeline.finish()


async def _run_phase(client: httpx.AsyncClient, config: BenchConfig, bodies: list[tuple[int, dict]],
                     offsets_s: list[float], progress: bool) -> list[RequestResult]:
    loop = asyncio.get_running_loop()
    limit = config.max_concurrency
    slots = asyncio.Semaphore(limit) if limit is not None else contextlib.nullcontext()
    bar = _progress_bar(len(bodies), progress)
    start_s = loop.time()

    async def one(index: int, body: dict, offset_s: float) -> RequestResult:
        if offset_s > 0:
            await asyncio.sleep(start_s + offset_s - loop.time())  # pacing, not synchronisation
        async with slots:
            result = await send_request(client, config, index, body)
        bar.update(1)
        return result

    try:
        return list(await asyncio.gather(*(one(i, b, o) for (i, b), o in zip(bodies, offsets_s))))
    finally:
        bar.close()


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm  # imported late: only the CLI path shows a bar
    return tqdm(total=total, file=sys.stderr, disable=not enabled, unit="req", dynamic_ncols=True)


def make_client(config: BenchConfig) -> httpx.AsyncClient:
    """A client whose pool holds one connection per request that may be in flight."""
    pool_size = config.max_concurrency or config.num_requests
    limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size)
    # trust_env=False: a load generator must hit the target itself, never an env-configured proxy.
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(config.timeout_s), trust_env=False)


def _request_bodies(config: BenchConfig, num_requests: int, first_index: int) -> list[tuple[int, dict]]:
    spec = PromptSpec(config.prompt_tokens, config.shared_prefix_ratio, config.seed)
    prompts = make_prompts(spec, num_requests, first_index)
    return [(first_index + i, build_request_body(config.endpoint, config.model, p, config.output_tokens))
            for i, p in enumerate(prompts)]


async def run_bench(config: BenchConfig, client: httpx.AsyncClient | None = None) -> BenchResult:
    """Run warm-up (excluded), then the measured requests; a given client is left open."""
    measured = _request_bodies(config, config.num_requests, first_index=0)
    # Warm-up prompts come after the measured ones, so measured indices never depend on it.
    warmup = _request_bodies(config, config.num_warmup, first_index=config.num_requests)
    own_client = client is None
    client = client or make_client(config)
    try:
        if warmup:
            await _run_phase(client, config, warmup, [0.0] * len(warmup), progress=False)
        offsets_s = arrival_offsets_s(len(measured), config.request_rate, config.burstiness, config.seed)
        start_ns = config.clock_ns()
        results = await _run_phase(client, config, measured, offsets_s, config.progress)
        duration_s = (config.clock_ns() - start_ns) / 1e9
    finally:
        if own_client:
            await client.aclose()
    return BenchResult(config=config, results=tuple(results), duration_s=duration_s,
                       summary=summarize(results, duration_s))
