"""Per-client token buckets for the beacon endpoint, in bounded memory."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class TokenBucketLimiter:
    """Token buckets keyed by client, at most `max_keys` of them (least recently seen evicted),
    so a flood from many addresses costs bounded memory.

    >>> now = [0.0]
    >>> limiter = TokenBucketLimiter(rate_per_s=1.0, burst=2, clock=lambda: now[0])
    >>> [limiter.acquire("1.2.3.4") for _ in range(3)]   # 0.0: allowed; else seconds to wait
    [0.0, 0.0, 1.0]
    >>> now[0] = 1.0; limiter.acquire("1.2.3.4")
    0.0
    """

    def __init__(self, rate_per_s: float, burst: int, *, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate_per_s > 0, burst >= 1 and max_keys >= 1 are required")
        self.rate_per_s, self.burst, self.max_keys = float(rate_per_s), int(burst), max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key → (tokens, t_s)
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float:
        """Take one token: 0.0 when allowed, else the seconds until one is available."""
        now_s = self._clock()
        with self._lock:
            tokens, last_s = self._buckets.pop(key, (float(self.burst), now_s))
            tokens = min(self.burst, tokens + max(now_s - last_s, 0.0) * self.rate_per_s)
            wait_s = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate_per_s
            self._buckets[key] = (tokens - 1.0 if wait_s == 0.0 else tokens, now_s)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        return wait_s

    def __len__(self) -> int:
        return len(self._buckets)
