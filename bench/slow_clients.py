"""Slow clients against the connection cap: which policy keeps real clients served
(docs/reference.md, "Access, beacon tokens and connection limits").

Three policies of the guarded protocol (tracer/web/http_guard.py), on one loopback server
each, serving a minimal app (the policy lives in the protocol, before any app):

- `cap only`: the cap as it was, the newcomer gets 503 (reclaim switched off);
- `per-address cap K`: at most K open connections per client address, on top of the cap;
- `reclaim`: what ships, a newcomer at the cap reclaims the slowest stalled connection.

Scenario A fills the cap with trickling bodies (one byte each 0.5 s) from one address or
from as many addresses as connections (127.0.0.x: an attacker with many addresses, which a
/64 of IPv6 gives anyone), then times real requests, one connection each. Scenario B sends
legitimate concurrent requests from a single address, as every client behind a reverse proxy
or a NAT arrives, with no attack at all. Last, what reclaiming costs: `_make_room`'s pass
over a full pool of stalled connections, timed in the server.

    .venv/bin/python bench/slow_clients.py            # pool 40, as the issue's attack
    .venv/bin/python bench/slow_clients.py --quick    # small, for its test
"""
from __future__ import annotations

import argparse
import asyncio
import select
import socket
import statistics
import threading
import time

import uvicorn

from tracer.web.http_guard import guarded_protocol_class
from tracer.web.limits import ConnectionLimits

TRICKLE_EVERY_S = 0.5
REQUEST = b"POST /x HTTP/1.1\r\nHost: b\r\nContent-Length: 5\r\n\r\nhello"


async def app(scope, receive, send):
    """Reads the body; `/slow` then works 0.5 s (a request the server is busy with)."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        return await send({"type": "lifespan.shutdown.complete"})
    while (message := await receive()).get("more_body"):
        pass
    if message["type"] == "http.disconnect":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(0.5)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def policy(name: str, limits: ConnectionLimits, per_address: int = 0, scans: list | None = None):
    base = guarded_protocol_class(limits)

    class Policy(base):
        def _make_room(self) -> bool:
            if name != "reclaim":   # the cap as it was, or the per-address alternative
                return False
            started = time.perf_counter()
            made = super()._make_room()
            if scans is not None:
                scans.append(time.perf_counter() - started)
            return made

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if per_address:
                peer = self.client[0] if self.client else None
                same = sum(1 for c in self.connections if c.client and c.client[0] == peer)
                self._over_capacity = self._over_capacity or same > per_address
    return Policy


class Server:
    def __init__(self, protocol) -> None:
        ready = threading.Event()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                    log_level="critical", http=protocol,
                                                    loop="uvloop", lifespan="on"))

        def run() -> None:
            async def main() -> None:
                task = asyncio.create_task(self.server.serve())
                while not self.server.started and not task.done():
                    await asyncio.sleep(0.002)
                ready.set()
                await task
            asyncio.run(main())
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def open(self) -> int:
        return len(self.server.server_state.connections)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def request(port: int, path: bytes = b"/x") -> tuple[int, float]:
    """One request on a new connection: (status, seconds); status 0 when cut."""
    started = time.perf_counter()
    with connect(port) as sock:
        sock.sendall(REQUEST.replace(b"/x", path, 1))
        answer = b""
        try:
            while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
                answer += chunk
        except OSError:
            pass
    return (int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0,
            time.perf_counter() - started)


def answered(sock: socket.socket) -> bool:
    """The server has sent something (or closed) on `sock`; nothing is read."""
    return bool(select.select([sock], [], [], 0)[0])


def wait_for(condition, timeout_s: float) -> bool:
    deadline, tick = time.monotonic() + timeout_s, threading.Event()
    while time.monotonic() < deadline:
        if condition():
            return True
        tick.wait(0.01)
    return condition()


def attack(server: Server, pool: int, addresses: int, requests: int,
           limits: ConnectionLimits) -> tuple[int, list[float]]:
    tricklers = []
    for i in range(pool):
        sock = connect(server.port, f"127.0.0.{2 + i % addresses}")
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: b\r\nContent-Length: 100000\r\n\r\n{")
        tricklers.append(sock)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(TRICKLE_EVERY_S):
            for sock in tricklers:
                try:
                    sock.send(b"x")
                except OSError:
                    pass
    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        # Each is in (its body owed) or was refused (a per-address cap's 503, then closed).
        assert wait_for(lambda: server.open() + sum(map(answered, tricklers)) >= pool, 10)
        # Every trickler is past the grace and judged stalled from here on.
        threading.Event().wait(limits.reclaim_after_s + 0.3)
        results = [request(server.port) for _ in range(requests)]
    finally:
        stop.set()
        feeder.join()
        for sock in tricklers:
            sock.close()
    wait_for(lambda: server.open() == 0, 10)
    return sum(s == 200 for s, _ in results), [t for s, t in results if s == 200]


def behind_one_address(server: Server, concurrent: int) -> int:
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(request(server.port, b"/slow")[0]))
               for _ in range(concurrent)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return sum(s == 200 for s in statuses)


def scan_cost(pool: int, reclaims: int) -> tuple[float, list[float]]:
    """The pass that finds no stalled connection in a full pool, and those that reclaim."""
    limits = ConnectionLimits(max_connections=pool, body_deadline_s=600, body_timeout_s=600)
    scans: list[float] = []
    server = Server(policy("reclaim", limits, scans=scans))
    idle = [connect(server.port) for _ in range(pool)]   # connected, silent
    try:
        assert wait_for(lambda: server.open() >= pool, 30)
        request(server.port)   # none stalled yet (all younger than the grace): a full pass
        full_pass = scans.pop()
        threading.Event().wait(limits.reclaim_after_s + 0.3)   # now every one is stalled
        for _ in range(reclaims):   # each stays open, so the next one must reclaim too
            sock = connect(server.port)
            idle.append(sock)
            sock.sendall(REQUEST)
            sock.recv(4096)
    finally:
        for sock in idle:
            sock.close()
        server.stop()
    return full_pass, scans


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=40)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--per-address", type=int, default=8)
    parser.add_argument("--behind-one", type=int, default=30)
    parser.add_argument("--scan-pool", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="pool 8, 4 requests, scan 100")
    args = parser.parse_args(argv)
    if args.quick:
        args.pool, args.requests, args.per_address, args.behind_one, args.scan_pool = 8, 4, 2, 6, 100
    limits = ConnectionLimits(max_connections=args.pool)
    k = args.per_address
    print(f"slow clients: cap {args.pool} connections filled with trickling bodies (1 byte "
          f"each {TRICKLE_EVERY_S:g} s), then {args.requests} real requests, one connection each")
    print(f"  {'policy':<22}{'attacker addresses':>20}{'served':>10}{'p50 ms':>9}{'max ms':>9}")
    cases = [("cap only", 0, 1), (f"per-address cap {k}", k, 1),
             (f"per-address cap {k}", k, args.pool), ("reclaim", 0, 1),
             ("reclaim", 0, args.pool)]
    for name, per_address, addresses in cases:
        server = Server(policy(name, limits, per_address))
        try:
            served, times = attack(server, args.pool, addresses, args.requests, limits)
        finally:
            server.stop()
        p50 = f"{statistics.median(times) * 1e3:9.1f}" if times else f"{'-':>9}"
        worst = f"{max(times) * 1e3:9.1f}" if times else f"{'-':>9}"
        print(f"  {name:<22}{addresses:>20}{f'{served}/{args.requests}':>10}{p50}{worst}")
    print(f"legitimate: {args.behind_one} concurrent requests from one address (as behind a "
          f"reverse proxy or NAT), each 0.5 s of work, no attack, cap {args.pool}")
    for name, per_address in ((f"per-address cap {k}", k), ("reclaim", 0)):
        server = Server(policy(name, limits, per_address))
        try:
            served = behind_one_address(server, args.behind_one)
        finally:
            server.stop()
        print(f"  {name:<22}served {served}/{args.behind_one}")
    full_pass, scans = scan_cost(args.scan_pool, args.requests)
    print(f"reclaim at a full pool of {args.scan_pool} connections, timed in the server:")
    print(f"  none stalled (a pass over all, then 503)  {full_pass * 1e6:7.0f} µs")
    print(f"  all stalled, {len(scans)} reclaims       median {statistics.median(scans) * 1e6:7.0f} µs,"
          f" max {max(scans) * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
