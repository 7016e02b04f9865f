"""The proxy benches' targets and what bench/proxy_overhead.py prints from them: its TTFT
and CPU tables, the CPU split into fixed per request and marginal per event, and the
--scale table. bench/relay_floor.py measures the same `Target`s."""
from __future__ import annotations

import math
import statistics
import subprocess
from dataclasses import dataclass, field


@dataclass
class Target:
    """One relaying path under test (direct, nginx, the proxy...) and what was measured
    through it."""
    name: str
    port: int
    process: subprocess.Popen | None = None
    cpu_pid: int | None = None           # the process doing the relaying (nginx: its worker)
    ttft_ms: dict[int, list[float]] = field(default_factory=dict)   # by concurrency
    failed: dict[int, int] = field(default_factory=dict)
    cpu_s: dict[int, float] = field(default_factory=dict)
    system_s: float = 0.0                # psutil's kernel ticks over cpu_s's batches
    ticked_s: float = 0.0                # psutil's user + kernel ticks over the same
    wall_s: dict[int, float] = field(default_factory=dict)
    num_requests: dict[int, int] = field(default_factory=dict)
    cpu_long_s: float = 0.0              # --long-chunks batches, at the top concurrency
    num_long: int = 0
    rss_idle_bytes: int = 0
    rss_open: dict[int, tuple[int, int]] = field(default_factory=dict)  # (streams open, rss)


def fixed_and_marginal(target: Target, args) -> tuple[float, float]:
    """(CPU per request in ms at zero events, CPU per further event in µs): the line through
    the default and the --long-chunks batches at the top concurrency."""
    c = max(args.concurrency)
    short = target.cpu_s[c] / target.num_requests[c]
    long = target.cpu_long_s / target.num_long
    per_event = (long - short) / (args.long_chunks - args.chunks)
    return (short - per_event * events_per_request(args)) * 1e3, per_event * 1e6


def short_batch_ms(target: Target, args) -> float:
    """CPU per request of the default batches at the top concurrency, in ms."""
    c = max(args.concurrency)
    return target.cpu_s[c] / target.num_requests[c] * 1e3


def long_batch_ms(target: Target, args) -> float:
    """CPU per request of the --long-chunks batches, in ms."""
    return target.cpu_long_s / target.num_long * 1e3


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def events_per_request(args) -> int:
    return args.chunks + 2   # role-only, content events, finish+[DONE]


def cpu_us_per_event(target: Target, concurrency: int, args) -> float:
    n = target.num_requests.get(concurrency, 0)
    return target.cpu_s.get(concurrency, 0.0) / n / events_per_request(args) * 1e6 if n else float("nan")


def report_failures(targets: list[Target]) -> None:
    failed = {t.name: sum(t.failed.values()) for t in targets}
    print("failed streams: " + ", ".join(f"{name} {n}" for name, n in failed.items()))


def report(targets: list[Target], args) -> None:
    by_name = {t.name: t for t in targets}
    print(f"\nfake upstream: {args.chunks} content events {args.gap_ms} ms apart; "
          f"{args.rounds} interleaved rounds of {args.requests_single} (1 stream) / "
          f"{args.requests} (more streams, {'one burst' if args.burst else 'staggered'}) "
          "requests per target\n")
    print(f"{'concurrency':>11} {'target':>15} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'+p50 vs direct':>15} {'+p99 vs direct':>15}")
    for c in args.concurrency:
        base = by_name["direct"].ttft_ms.get(c, [])
        for t in targets:
            v = t.ttft_ms.get(c, [])
            print(f"{c:>11} {t.name:>15} {len(v):>5} {median(v):>8.3f} "
                  f"{percentile(v, 0.99):>8.3f} {median(v) - median(base):>15.3f}"
                  f" {percentile(v, 0.99) - percentile(base, 0.99):>15.3f}")
        if "nginx" in by_name:
            for t in targets:
                if t.name.startswith("proxy"):
                    n = by_name["nginx"].ttft_ms.get(c, [])
                    v = t.ttft_ms.get(c, [])
                    print(f"{c:>11} {t.name + ' - nginx':>31}: p50 "
                          f"{median(v) - median(n):+.3f} ms, p99 "
                          f"{percentile(v, 0.99) - percentile(n, 0.99):+.3f} ms "
                          "(target: <= 1 ms, <= 3 ms)")
    report_failures(targets)
    events = events_per_request(args)
    print("\nCPU of the relaying process while its own batches ran:")
    for t in targets:
        num_requests = sum(t.num_requests.values())
        if t.cpu_pid is not None and num_requests:
            per_req_ms = sum(t.cpu_s.values()) / num_requests * 1e3
            # The ticks' split of the ns total: ticks alone can exceed it in a short batch.
            system_ms = per_req_ms * t.system_s / t.ticked_s if t.ticked_s > 0 else 0.0
            print(f"  {t.name:>15}: {per_req_ms:.3f} ms/request, "
                  f"{per_req_ms / events * 1e3:.1f} us/relayed SSE event "
                  f"({num_requests} requests, {events} events each; "
                  f"user {per_req_ms - system_ms:.3f} + system {system_ms:.3f} ms/request)")
    measured = [t for t in targets if t.cpu_pid is not None and t.num_long and t.num_requests]
    if not measured:
        return
    print(f"\nCPU split, from the same run's {args.long_chunks}-event streams at "
          f"{max(args.concurrency)} streams (fixed per request + marginal per event):")
    nginx = next((fixed_and_marginal(t, args) for t in measured if t.name == "nginx"), None)
    for t in measured:
        fixed_ms, per_event_us = fixed_and_marginal(t, args)
        vs = (f"  ({ratio(fixed_ms, nginx[0])}, {ratio(per_event_us, nginx[1])} nginx's)"
              if nginx and t.name != "nginx" else "")
        print(f"  {t.name:>15}: {fixed_ms:.3f} ms/request + {per_event_us:.1f} us/event{vs}")
    print(f"\nCPU per request at {max(args.concurrency)} streams, as measured (ratio to nginx's):")
    for label, per_request in ((events, short_batch_ms), (args.long_chunks + 2, long_batch_ms)):
        base = next((per_request(t, args) for t in measured if t.name == "nginx"), None)
        print(f"  {label:>5} events: " + "   ".join(
            f"{t.name} {per_request(t, args):.3f} ms"
            + (f" ({ratio(per_request(t, args), base)})" if base and t.name != "nginx" else "")
            for t in measured))


def report_scale(targets: list[Target], args) -> None:
    print(f"\nscale: fake upstream {args.chunks} content events {args.gap_ms} ms apart; "
          f"{args.rounds} interleaved rounds of {args.streams_per_connection} streams per "
          "connection; RSS idle before the first batch\n")
    print(f"{'streams':>7} {'target':>15} {'n':>6} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'us/event':>9} {'cpu %':>6} {'KiB/open stream':>16} {'open at RSS sample':>19}")
    for c in args.concurrency:
        for t in targets:
            v = t.ttft_ms.get(c, [])
            num_open, rss = t.rss_open.get(c, (0, 0))
            kib = (rss - t.rss_idle_bytes) / num_open / 1024 if num_open else float("nan")
            busy_pct = 100 * t.cpu_s.get(c, 0.0) / t.wall_s[c] if t.wall_s.get(c) else float("nan")
            print(f"{c:>7} {t.name:>15} {len(v):>6} {t.failed.get(c, 0):>6} {median(v):>8.3f} "
                  f"{percentile(v, 0.99):>8.3f} {cpu_us_per_event(t, c, args):>9.1f} "
                  f"{busy_pct:>6.0f} {kib:>16.1f} {num_open:>19}")
    by_name, top = {t.name: t for t in targets}, max(args.concurrency)
    if "nginx" not in by_name:
        return
    nginx = by_name["nginx"]
    for t in targets:
        if t.name.startswith("proxy"):
            p99 = ratio(percentile(t.ttft_ms.get(top, []), 0.99),
                        percentile(nginx.ttft_ms.get(top, []), 0.99))
            cpu = ratio(cpu_us_per_event(t, top, args), cpu_us_per_event(nginx, top, args))
            print(f"{t.name} / nginx at {top} streams: p99 TTFT {p99}, "
                  f"CPU per relayed event {cpu}")


def ratio(a: float, b: float) -> str:
    """"n/a" where `b` is not a measurement (0: nothing was measured).

    >>> ratio(3.0, 2.0), ratio(1.0, 0.0)
    ('1.50x', 'n/a')
    """
    return f"{a / b:.2f}x" if b > 0 and math.isfinite(a / b) else "n/a"
