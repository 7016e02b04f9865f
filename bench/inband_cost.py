"""The in-band timing line's cost per request on the server, and its size.

    .venv/bin/python bench/inband_cost.py [--repeat 20000]

What a server adds per streamed request (tracer/web/inband.py):
- without `X-TTFT-Timing: 1`: one scan of the request headers (`wants_timing`) and nothing
  else; the stream is unchanged;
- with it: `InbandTimer.line` once, right before `[DONE]`: a timeline snapshot, the payload
  (send offsets of up to 32 content events, the stage durations), compact JSON, base64url,
  HMAC-SHA256 and the comment framing.
Timed on realistic timelines (the engine's nine stages, the proxy's five; 1, 8 and 32+ content
events), median of per-call times over `--repeat` calls in blocks, one core.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tracer.core.request_tracer import Tracer  # noqa: E402
from tracer.record.clock import Clock  # noqa: E402
from tracer.record.stages import PROXY_STAGES, SERVER_STAGES  # noqa: E402
from tracer.web.inband import InbandTimer, wants_timing  # noqa: E402
from tracer.web.probe.token import BeaconSigner  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
MS = 1_000_000
# A browser's streamed chat request as uvicorn hands it over (a typical header set).
SCOPE = {"headers": [
    (b"host", b"chat.example"), (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) Chrome/131"),
    (b"accept", b"text/event-stream"), (b"accept-language", b"en-US,en;q=0.9"),
    (b"accept-encoding", b"gzip, deflate, br"), (b"content-type", b"application/json"),
    (b"content-length", b"212"), (b"origin", b"https://chat.example"),
    (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    (b"referer", b"https://chat.example/"), (b"sec-fetch-mode", b"cors")]}


def active_request(stages: tuple[str, ...], num_emits: int):
    tracer = Tracer(model_names=(MODEL,), stages=stages)
    active = tracer.begin(request_id="r", model=MODEL, operation="chat", traceparent=None,
                          start_ns=1_000 * MS)
    t = 1_000 * MS
    for stage in stages:
        t += 3 * MS + 137_000
        active.timeline.mark(stage, t)
        if stage == stages[-2]:
            active.timeline.event("response_start", t)
    for i in range(num_emits):
        active.timeline.emit(t + i * 14 * MS + 21_000)
    return active


def per_call_us(fn, repeat: int, block: int = 200) -> float:
    samples = []
    for _ in range(max(repeat // block, 5)):
        t0 = time.perf_counter_ns()
        for _ in range(block):
            fn()
        samples.append((time.perf_counter_ns() - t0) / block / 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    signer, clock = BeaconSigner(b"k" * 32), Clock()
    absent = SCOPE
    present = {"headers": [*SCOPE["headers"], (b"x-ttft-timing", b"1")]}
    print("in-band timing line, per streamed request (median, one core):")
    print(f"  header check, header absent    {per_call_us(lambda: wants_timing(absent), args.repeat):6.2f} µs")
    print(f"  header check, header present   {per_call_us(lambda: wants_timing(present), args.repeat):6.2f} µs")
    for source, stages in (("engine", SERVER_STAGES), ("proxy", PROXY_STAGES)):
        timer = InbandTimer(signer, clock, source=source, stages=stages)
        for num_emits in (1, 8, 32, 256):
            active = active_request(stages, num_emits)
            line = timer.line(active)
            us = per_call_us(lambda: timer.line(active), args.repeat)
            print(f"  {source:<6} {len(stages)} stages, {num_emits:>3} content events: build + "
                  f"sign {us:6.1f} µs, {len(line):>4} bytes on the wire")


if __name__ == "__main__":
    main()
