"""Where an OTLP/HTTP export is inflated and decoded: never on the event loop, and never more
of them at once than a small pool allows.

Inflating and decoding an export is CPU work proportional to what its sender chose (up to
16 MiB inflated, tens of thousands of spans), and building its message takes memory in
proportion too. On the loop it would stall every stream the proxy relays; on an unbounded
pool (`asyncio.to_thread`) a flood of exports would queue without end and hold all their
bodies and messages at once. So `DecodePool` runs the work on `max_workers` threads (one by
default: decoding is mostly Python holding the GIL, so a second thread decodes no faster and
only makes the loop wait longer for the GIL; it would double the memory in flight) and admits
at most `max_workers + max_waiting` exports; the next one is answered 503 with `Retry-After`
at once (OTLP/HTTP, "Failures": the exporter retries with backoff), without being read
further. The counts of `tracer.engines.otlp_bounds` run first, on the same thread.
"""
from __future__ import annotations

import asyncio
import zlib
from concurrent.futures import ThreadPoolExecutor

from tracer.engines.spans import ExportLimits, request_from_json, request_from_protobuf

JSON = "application/json"


class TooLarge(Exception):
    """The body inflates past the limit."""


class DecodePool:
    """A bounded pool; `try_enter`/`leave` are called on the event loop only (no lock).

    >>> pool = DecodePool(max_workers=1, max_waiting=1)
    >>> pool.try_enter(), pool.try_enter(), pool.try_enter()
    (True, True, False)
    >>> pool.leave(); pool.try_enter()
    True
    """

    def __init__(self, max_workers: int = 1, max_waiting: int = 7) -> None:
        self.max_workers = max_workers
        self.capacity = max_workers + max_waiting
        self.in_use = 0
        self._executor: ThreadPoolExecutor | None = None

    def try_enter(self) -> bool:
        if self.in_use >= self.capacity:
            return False
        self.in_use += 1
        return True

    def leave(self) -> None:
        self.in_use -= 1

    async def run(self, fn, *args):
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="otlp-decode")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


def decode(body: bytes, content_type: str, encoding: str, max_decoded_bytes: int,
           limits: ExportLimits):
    """The export's message (on a pool thread). Raises `TooLarge`, `zlib.error` (not gzip)
    or `MalformedOTLP` (its `outcome` says which refusal)."""
    data = body if encoding == "identity" else gunzip(body, max_decoded_bytes)
    if content_type == JSON:
        return request_from_json(data, limits)
    return request_from_protobuf(data, limits)


def gunzip(data: bytes, limit: int) -> bytes:
    """Inflate at most `limit` bytes; more raises `TooLarge` (without inflating the rest).

    >>> import gzip; gunzip(gzip.compress(b"abc"), 10)
    b'abc'
    """
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = inflater.decompress(data, limit)
    if inflater.unconsumed_tail or len(out) > limit:
        raise TooLarge()
    out += inflater.flush()
    if len(out) > limit:
        raise TooLarge()
    if not inflater.eof:
        raise zlib.error("truncated gzip stream")
    return out
