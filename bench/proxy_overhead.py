"""What the tracing proxy adds: TTFT through it vs direct vs nginx, and its CPU cost.

    .venv/bin/python bench/proxy_overhead.py [--rounds 5] [--chunks 8] [--gap-ms 20] [--untraced]
                                             [--no-export | --both-exports] [--scale]

The upstream is the fake SSE server (`tracer.testing.fake_upstream`, its own process): it
answers at once and streams `--chunks` content events `--gap-ms` apart, so the upstream is
not the noise and TTFT is the path's own latency. In front of it, each in its own process:
nothing (direct), nginx (`proxy_buffering off`, HTTP/1.1 keep-alive upstream, one worker)
and `python -m tracer proxy` (tracing on, its SQLite store in the run's temporary folder,
spans exported over OTLP/HTTP to
`bench/lib/span_sink.py`; `--untraced` adds a `--no-tracing` proxy, `--no-export` drops the
exporter, `--both-exports` runs a second traced proxy without one, "proxy-no-export", so
both CPU lines come from one interleaved run). A lean asyncio HTTP/1.1 client
(bench/lib/stream_client.py, in this process, keep-alive, one connection per stream)
measures TTFT from writing the request to the first chunk with non-empty content. The
targets take turns in every round (interleaved), at 1 and at 32 concurrent streams. CPU is the process's
user+system time (its scheduler clock in ns, bench/lib/process_cpu.py) while its own
batches ran, divided by requests and by relayed SSE events, and split into user and system
(kernel) time in the ratio of psutil's counts, which tick every 10 ms. At the top concurrency each
relaying target also runs one batch per round of `--long-chunks` (64) events per stream, as
long in time, right after its own; the line through the two splits CPU into a fixed cost
per request and a marginal cost per event, each with its ratio to nginx's. Target: within
1 ms of nginx at p50 and 3 ms at p99. A stream that is not a 200, breaks off or does not
end in time is counted as failed (the long batches' too), not measured. The tables are printed
by bench/lib/proxy_report.py.

`--scale`: nginx and the proxy only, at `--scale-concurrency` (256 and 1,000) streams,
interleaved, `--rounds` (default 2 here) rounds of `--streams-per-connection` streams per
connection; events default to 20, 100 ms apart (2 s streams, 11,000 events/s at 1,000
streams). Per target: failed streams, p50/p99 TTFT, CPU per relayed event, the relaying
process's CPU as a % of one core while its batches ran (one event loop saturates at 100),
and RSS per open stream: the highest RSS
sampled while the batch had its streams open, minus the RSS idle before the first scale
batch, divided by the streams open at that sample (nginx: its worker's). Then the
proxy/nginx ratios of p99 TTFT and CPU per event at the largest concurrency.

File descriptors: 1,000 streams are 2,000 sockets in nginx and in the proxy. nginx's
`worker_connections` counts both sides, so it is 8192 here (1024 cannot hold 1,000
streams), and every process needs `ulimit -n` above 2 x the streams (20000 on the bench
machine): main() raises the soft limit to fit or stops with a message. The proxy's own
limits (upstream pool `--max-connections`, `--max-client-connections`) are raised above
the largest concurrency as nginx's is, so neither queues nor refuses a stream.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # bench.lib, when run as `python bench/proxy_overhead.py`

from bench.lib.loopback import start_listening, wait_child_pid  # noqa: E402
from bench.lib.process_cpu import process_cpu_s  # noqa: E402
from bench.lib.proxy_report import (Target, report, report_failures,  # noqa: E402
                                    report_scale)
from bench.lib.span_sink import nginx_binary, span_sink  # noqa: E402
from bench.lib.stream_client import MODEL, run_batch  # noqa: E402

NGINX_WORKER_CONNECTIONS = 8192
NGINX_CONF = """worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections {worker_connections}; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  upstream fake {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port} backlog=2048;
    location / {{
      proxy_pass http://fake;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_cache off;
    }}
  }}
}}
"""


def bench_env(root: Path = ROOT) -> dict:
    """The benched processes' environment: the tree at `root` (this one unless another is
    benched) on the path, no exporter unless asked."""
    return {**os.environ, "PYTHONPATH": str(root), "OTEL_EXPORTER_OTLP_ENDPOINT": ""}


def start_upstream(args, tmp: Path) -> tuple[int, subprocess.Popen]:
    """The fake upstream: `args.chunks` content events `args.gap_ms` apart."""
    return start_listening(
        lambda port: [sys.executable, "-m", "tracer.testing.fake_upstream", "--port", str(port),
                      "--chunks", str(args.chunks), "--gap-ms", str(args.gap_ms)],
        tmp / "fake-upstream.log", env=bench_env(), cwd=ROOT)


def start_proxy(name: str, upstream_port: int, max_streams: int, tmp: Path,
                traces_url: str | None, extra: list[str] = (),
                root: Path = ROOT) -> tuple[int, subprocess.Popen]:
    """One `python -m tracer proxy` of the tree at `root` in front of the upstream, its store
    in `tmp`, its spans exported to `traces_url` (None: no exporter, so no spans are built),
    its limits above `max_streams` streams so that it neither queues nor refuses one."""
    limit = str(max_streams + 64)
    return start_listening(
        lambda port: [sys.executable, "-m", "tracer", "proxy", "--upstream",
                      f"http://127.0.0.1:{upstream_port}", "--listen", f"127.0.0.1:{port}",
                      "--served-model-name", MODEL, "--max-connections", limit,
                      "--max-client-connections", limit, "--log-format", "json",
                      "--data-dir", str(tmp / f"{name}-data"), *extra],
        tmp / f"{name}.log", cwd=root,
        env={**bench_env(root), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url or ""})


def start_nginx(nginx: str, upstream_port: int, tmp: Path) -> Target:
    """nginx in front of the upstream (`NGINX_CONF`); its CPU is its one worker's."""
    def nginx_argv(port: int) -> list[str]:
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(
            prefix=tmp, port=port, upstream_port=upstream_port,
            worker_connections=NGINX_WORKER_CONNECTIONS))
        return [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"]
    port, proc = start_listening(nginx_argv, tmp / "nginx.log", env=bench_env(), cwd=ROOT)
    return Target("nginx", port, proc, wait_child_pid(proc))


def start_processes(args, tmp: Path, traces_url: str) -> tuple[list[Target], list[subprocess.Popen]]:
    nginx = nginx_binary()
    # Spans are built and exported as in production (batches, OTLP/HTTP) to `traces_url`
    # (bench/lib/span_sink.py); without an exporter no spans are built.
    upstream_port, proc = start_upstream(args, tmp)
    processes = [proc]
    targets = [Target("direct", upstream_port)]
    if nginx is not None:
        target = start_nginx(nginx, upstream_port, tmp)
        processes.append(target.process)
        targets.append(target)
    else:
        print("nginx not installed (apt-get install -y nginx): skipped", file=sys.stderr)
    proxies = [("proxy", [], not args.no_export)]
    if args.both_exports:
        proxies.append(("proxy-no-export", [], False))
    if args.untraced:
        proxies.append(("proxy-untraced", ["--no-tracing"], False))
    for name, extra, export in proxies:
        port, proc = start_proxy(name, upstream_port, max(args.concurrency), tmp,
                                 traces_url if export else None, extra)
        targets.append(Target(name, port, proc, proc.pid))
        processes.append(proc)
    return targets, processes


def cpu_seconds(pid: int | None) -> float:
    return 0.0 if pid is None else process_cpu_s(pid)


def ticked_seconds(pid: int | None) -> tuple[float, float]:
    """psutil's (user + system, system) of the process so far, in 10 ms ticks: their ratio
    splits the ns total; the ticks alone can exceed it in a short batch."""
    if pid is None:
        return 0.0, 0.0
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system, times.system


def measure(targets: list[Target], args, requests_at) -> None:
    """Every concurrency, `args.rounds` interleaved rounds after a warm-up round;
    `requests_at(c)`: the requests per target per round at concurrency c."""
    stream_s = args.chunks * args.gap_ms / 1e3
    for concurrency in args.concurrency:
        for round_i in range(args.rounds + 1):          # round 0 warms every path up
            order = targets[round_i % len(targets):] + targets[:round_i % len(targets)]
            for target in order:
                cpu_before, ticks_before, wall_before = (
                    cpu_seconds(target.cpu_pid), ticked_seconds(target.cpu_pid), time.monotonic())
                stagger_s = 0.0 if args.burst else stream_s / concurrency
                batch = asyncio.run(run_batch(
                    target.port, concurrency,
                    requests_at(concurrency) if round_i else concurrency * 2, stagger_s,
                    stream_timeout_s=30 + 4 * stream_s, rss_pid=target.cpu_pid))
                target.rss_open[concurrency] = max(target.rss_open.get(concurrency, (0, 0)),
                                                   batch.peak)
                if round_i == 0:
                    continue
                c = concurrency
                cpu, ticks = cpu_seconds(target.cpu_pid), ticked_seconds(target.cpu_pid)
                target.cpu_s[c] = target.cpu_s.get(c, 0.0) + cpu - cpu_before
                target.ticked_s += ticks[0] - ticks_before[0]
                target.system_s += ticks[1] - ticks_before[1]
                target.wall_s[c] = target.wall_s.get(c, 0.0) + time.monotonic() - wall_before
                target.num_requests[c] = target.num_requests.get(c, 0) + len(batch.ttft_ms)
                target.failed[c] = target.failed.get(c, 0) + batch.num_failed
                target.ttft_ms.setdefault(c, []).extend(batch.ttft_ms)
                if (args.long_chunks and c == max(args.concurrency) and not args.scale
                        and target.cpu_pid is not None):
                    measure_long(target, args, requests_at(c))


def measure_long(target: Target, args, num_requests: int) -> None:
    """One batch of `--long-chunks` events per stream, as long in time as the default
    stream, so fixed per-request and marginal per-event CPU can be told apart."""
    gap_ms = args.chunks * args.gap_ms / args.long_chunks
    headers = b"x-fake-chunks: %d\r\nx-fake-gap-ms: %r\r\n" % (args.long_chunks, gap_ms)
    c = max(args.concurrency)
    before = cpu_seconds(target.cpu_pid)
    stagger_s = args.chunks * args.gap_ms / 1e3 / c
    batch = asyncio.run(run_batch(target.port, c, num_requests, stagger_s,
                                  stream_timeout_s=60, extra_headers=headers))
    target.cpu_long_s += cpu_seconds(target.cpu_pid) - before
    target.num_long += len(batch.ttft_ms)
    target.failed[c] = target.failed.get(c, 0) + batch.num_failed


def raise_fd_limit(concurrency: int) -> None:
    """Each stream is two sockets in nginx and in the proxy; children inherit this limit."""
    needed = 2 * concurrency + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            sys.exit(f"ulimit -n is {hard} at most; {concurrency} streams need {needed}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # p99 of 1,280 samples per target at 32 streams: with fewer, the 4th-worst sample of
    # one noisy round moves p99 by a millisecond on this 2-core machine.
    parser.add_argument("--rounds", type=int, help="default 5; 2 with --scale")
    parser.add_argument("--requests", type=int, default=256,
                        help="per target per round, above one stream")
    parser.add_argument("--requests-single", type=int, default=32,
                        help="per target per round, at one stream")
    # 20 ms: a 50 tokens/s stream. Much shorter gaps make 32 back-to-back streams a
    # throughput test that saturates a Python proxy on two cores.
    parser.add_argument("--chunks", type=int, help="default 8; 20 with --scale")
    parser.add_argument("--gap-ms", type=float, help="default 20; 100 with --scale")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--long-chunks", type=int, default=64,
                        help="content events of the extra batch that splits CPU into fixed "
                             "per request and marginal per event (0: no such batch)")
    parser.add_argument("--untraced", action="store_true", help="add a --no-tracing proxy")
    exports = parser.add_mutually_exclusive_group()
    exports.add_argument("--no-export", action="store_true",
                         help="no OTLP exporter in the traced proxy (spans are then not built)")
    exports.add_argument("--both-exports", action="store_true",
                         help="add a traced proxy without an exporter (proxy-no-export)")
    parser.add_argument("--burst", action="store_true",
                        help="start all streams of a batch at once (default: staggered)")
    parser.add_argument("--scale", action="store_true",
                        help="nginx and the proxy at --scale-concurrency streams")
    parser.add_argument("--scale-concurrency", type=int, nargs="+", default=[256, 1000])
    parser.add_argument("--streams-per-connection", type=int, default=2,
                        help="with --scale: back-to-back streams on each connection per round")
    args = parser.parse_args(argv)
    scale_defaults = {"rounds": 2, "chunks": 20, "gap_ms": 100.0}
    plain_defaults = {"rounds": 5, "chunks": 8, "gap_ms": 20.0}
    for key, value in (scale_defaults if args.scale else plain_defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.scale:
        args.concurrency = sorted(args.scale_concurrency)
    if args.long_chunks and args.long_chunks <= args.chunks:
        parser.error("--long-chunks must exceed --chunks (or be 0)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    raise_fd_limit(max(args.concurrency))
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp, \
            span_sink(Path(tmp)) as traces_url:
        targets, processes = start_processes(args, Path(tmp), traces_url)
        try:
            if args.scale:
                targets = [t for t in targets if t.cpu_pid is not None]
                for t in targets:     # first requests load lazy code paths: not per-stream memory
                    asyncio.run(run_batch(t.port, 4, 8))
                    t.rss_idle_bytes = psutil.Process(t.cpu_pid).memory_info().rss
                measure(targets, args, lambda c: c * args.streams_per_connection)
            else:
                measure(targets, args,
                        lambda c: args.requests_single if c == 1 else args.requests)
        finally:
            for proc in reversed(processes):
                proc.terminate()
                proc.wait(timeout=30)
    if args.scale:
        report_scale(targets, args)
        report_failures(targets)
    else:
        report(targets, args)


if __name__ == "__main__":
    main()
