"""A lean asyncio HTTP/1.1 client for streamed chat completions, for the proxy benchmarks.

Keep-alive, one connection per concurrent stream, chunked SSE read by hand: the client costs
little CPU next to the paths it measures. TTFT runs from writing the request to the first
chunk with non-empty content; a stream that is not a 200, breaks off or does not end in time
is counted as failed instead of raising, so a run at scale reports how many failed.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import psutil

MODEL = "fake-model"
RSS_SAMPLE_S = 0.05      # how often run_batch reads the relaying process's RSS


@dataclass
class Batch:
    ttft_ms: list[float] = field(default_factory=list)
    num_failed: int = 0
    peak: tuple[int, int] = (0, 0)       # (streams open, rss bytes) at the fullest sample


def request_bytes(port: int, extra_headers: bytes = b"") -> bytes:
    body = (b'{"model":"' + MODEL.encode() + b'","stream":true,'
            b'"messages":[{"role":"user","content":"hi"}],"max_tokens":16}')
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (port, extra_headers, len(body), body))


async def one_stream(reader, writer, request: bytes) -> float | None:
    """TTFT in ms of one streamed request on a kept-alive connection, read to its end; None
    when it failed (not a 200, broken off, or no content): the connection is then unusable."""
    start = time.perf_counter()
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return None
        ttft_ms = None
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return ttft_ms
            if ttft_ms is None and b'"content":"tok' in data:
                ttft_ms = (time.perf_counter() - start) * 1e3
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None


async def run_batch(port: int, concurrency: int, num_requests: int, stagger_s: float = 0.0,
                    stream_timeout_s: float = 60.0, rss_pid: int | None = None,
                    extra_headers: bytes = b"") -> Batch:
    """`num_requests` streams over `concurrency` kept-alive connections. Worker i starts
    i·stagger_s late, so the streams overlap in steady state instead of arriving as one
    burst every stream length (a burst measures queueing, not the path). `rss_pid`'s RSS is
    sampled meanwhile; the fullest sample is kept. `extra_headers` (CRLF-terminated lines)
    go on every request."""
    request, batch = request_bytes(port, extra_headers), Batch()
    per_worker = max(num_requests // concurrency, 1)
    num_open = 0

    async def worker(i: int) -> None:
        nonlocal num_open
        await asyncio.sleep(i * stagger_s)
        reader = writer = None
        for _ in range(per_worker):
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                num_open += 1
                ttft = await asyncio.wait_for(one_stream(reader, writer, request),
                                              stream_timeout_s)
            except (OSError, asyncio.TimeoutError):
                ttft = None
            finally:
                num_open = max(num_open - 1, 0)
            if ttft is None:
                batch.num_failed += 1
                if writer is not None:
                    writer.close()
                reader = writer = None
            else:
                batch.ttft_ms.append(ttft)
        if writer is not None:
            writer.close()

    async def sample_rss(process: psutil.Process) -> None:
        while True:
            batch.peak = max(batch.peak, (num_open, process.memory_info().rss))
            await asyncio.sleep(RSS_SAMPLE_S)

    sampler = (asyncio.create_task(sample_rss(psutil.Process(rss_pid)))
               if rss_pid is not None else None)
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        if sampler is not None:
            sampler.cancel()
    return batch
