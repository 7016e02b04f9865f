"""What the relay costs without uvicorn's ASGI layer: the floor to know before a raw protocol
is adopted.

    .venv/bin/python bench/relay_floor.py [--rounds 3] [--concurrency 32] [--requests 256]
    .venv/bin/python bench/relay_floor.py --chunks 64 --concurrency 8 --requests 64 --export

In one interleaved run, from the fake upstream (`--chunks` content events 20 ms apart,
default 8): nginx, the proxy (`python -m tracer proxy`, tracing on, no exporter; with
`--export` a second proxy exports its spans over OTLP/HTTP, as `bench/proxy_overhead.py`'s
does), the proxy with `--no-tracing`, and
`raw`: this file's `--serve` mode, a bare relay on the same pieces the proxy's data plane uses
(uvloop, llhttp through httptools, `tracer.proxy.upstream`'s pool and `Http1Connection`) but
answering the client from an `asyncio.Protocol` that writes the chunked response itself: no
ASGI scope, messages, task per request or middleware, and no tracing. It is the floor a raw
protocol for the completion routes could reach, not a product: no limits, no errors beyond a
502, no other paths. Prints CPU per relayed SSE event of each relaying process and its ratio
to nginx's. Read top to bottom at `--chunks 64 --concurrency 8` (the proxy bench's 66-event
load), the rows split the proxy's price into what Python and uvloop cost (raw), what ASGI and
the proxy's own checks add (untraced), what tracing adds and what exporting the spans adds.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # bench.lib and tracer, when run as `python bench/relay_floor.py`

from bench.lib.loopback import start_listening  # noqa: E402
from bench.lib.span_sink import span_sink  # noqa: E402


def serve(port: int, upstream_url: str) -> None:
    """The bare relay (run in its own process by `--serve`)."""
    import httptools
    import uvloop

    from tracer.proxy.upstream import Upstream
    from tracer.proxy.upstream_errors import UpstreamFailure

    class Relay(asyncio.Protocol):
        def __init__(self, upstream: Upstream) -> None:
            self.upstream, self.parser = upstream, httptools.HttpRequestParser(self)
            self.body, self.transport, self.url = [], None, b""

        def connection_made(self, transport) -> None:
            self.transport = transport
            # As uvicorn does: every small write goes out at once (no Nagle coalescing).
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, self.body = b"".join(self.body), []
            asyncio.get_running_loop().create_task(self.answer(body))

        async def answer(self, body: bytes) -> None:
            write = self.transport.write
            exchange = self.upstream.exchange("POST", self.url.decode(), b"",
                                              [("content-type", "application/json")], body)
            try:
                head = await exchange.response_head()
            except UpstreamFailure:
                write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                return
            write(b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\n"
                  b"transfer-encoding: chunked\r\n\r\n" % head.status)
            try:
                while chunk := await exchange.read():
                    write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            finally:
                exchange.close()
            write(b"0\r\n\r\n")

    async def main() -> None:
        upstream = Upstream(upstream_url)
        server = await asyncio.get_running_loop().create_server(
            lambda: Relay(upstream), "127.0.0.1", port, backlog=2048)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def main() -> None:
    import proxy_overhead as po
    from bench.lib import stream_client as sc
    from bench.lib.proxy_report import Target, events_per_request

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=8, help="content events per stream")
    parser.add_argument("--export", action="store_true",
                        help="also a traced proxy exporting its spans (to a sink on loopback)")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "UPSTREAM_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(int(args.serve[0]), args.serve[1])
    # `both_exports` starts "proxy" (exporting) and "proxy-no-export"; without it "proxy"
    # does not export (`no_export`).
    setup = argparse.Namespace(chunks=args.chunks, gap_ms=20.0, no_export=not args.export,
                               untraced=True, concurrency=[args.concurrency],
                               both_exports=args.export)
    events = events_per_request(setup)
    with tempfile.TemporaryDirectory() as tmp, span_sink(Path(tmp)) as traces_url:
        targets, processes = po.start_processes(setup, Path(tmp), traces_url)
        upstream_port = targets[0].port
        port, raw = start_listening(
            lambda port: [sys.executable, __file__, "--serve", str(port),
                          f"http://127.0.0.1:{upstream_port}"], Path(tmp) / "raw.log", cwd=ROOT)
        processes.append(raw)
        try:
            targets = [t for t in targets if t.name != "direct"]
            targets.append(Target("raw", port, raw, raw.pid))
            cpu = {t.name: 0.0 for t in targets}
            count = {t.name: 0 for t in targets}
            # Streams start one stream's length / concurrency apart: a steady state.
            stagger_s = args.chunks * 20e-3 / args.concurrency
            for round_i in range(args.rounds + 1):          # round 0 warms up
                order = targets[round_i % len(targets):] + targets[:round_i % len(targets)]
                for t in order:
                    before = po.cpu_seconds(t.cpu_pid)
                    batch = asyncio.run(sc.run_batch(t.port, args.concurrency, args.requests
                                                     if round_i else args.concurrency, stagger_s))
                    if round_i:
                        cpu[t.name] += po.cpu_seconds(t.cpu_pid) - before
                        count[t.name] += len(batch.ttft_ms)
                        assert batch.num_failed == 0, f"{t.name}: {batch.num_failed} failed"
        finally:
            for p in processes:
                p.terminate()
    nginx_us = cpu["nginx"] / count["nginx"] / events * 1e6 if "nginx" in cpu else None
    print(f"\n{args.rounds} interleaved rounds of {args.requests} streams at concurrency "
          f"{args.concurrency}, {events} events each; CPU per relayed SSE event of the "
          f"relaying process:")
    for name in cpu:
        us = cpu[name] / count[name] / events * 1e6
        ratio = f"({us / nginx_us:4.2f}x nginx)" if nginx_us else "(no nginx to compare)"
        print(f"  {name:>15}: {us:7.1f} us/event  {ratio}")


if __name__ == "__main__":
    main()
