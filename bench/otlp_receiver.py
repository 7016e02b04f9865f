"""The proxy's OTLP receiver and engine join: receiver throughput, the join's cost per
proxied request, and the pending table's memory at its bound.

    .venv/bin/python bench/otlp_receiver.py [--exports 200 --spans 500 --rounds 15]

1. Receiver throughput: a real `python -m tracer proxy` subprocess on loopback takes
   `--exports` OTLP exports of `--spans` vLLM `llm_request` spans each (for unknown traces:
   decoded, matched by the adapters, counted `unmatched_span`), over OTLP/HTTP protobuf and
   OTLP/gRPC, interleaved; spans/s per core = spans / the proxy process's CPU seconds
   (psutil) over all of a transport's batches. The client runs in this process.
2. The join's cost per proxied request, in-process, one core: `Tracer.begin` + the proxy's
   marks + `finish` with no sinks, against the same through `EngineJoin` (an in-band
   llama.cpp signal: placement and the engine's stages; and no signal), interleaved rounds,
   medians of per-request µs.
3. The pending table at `--max-pending` records (tracemalloc, bytes per parked record).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import httpx  # noqa: E402
import psutil  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span  # noqa: E402

from tracer.core.request_tracer import Tracer  # noqa: E402
from tracer.engines.timing import EngineTiming  # noqa: E402
from tracer.proxy.engine_join import EngineJoin, JoinSettings  # noqa: E402
from tracer.record.stages import PROXY_STAGES  # noqa: E402
from tracer.sinks.engine_timing import EngineTimingMetrics  # noqa: E402

MODEL = "m"
MS = 1_000_000
GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_export(num_spans: int) -> bytes:
    """One export of vLLM-shaped request spans (tracer/testing/engine_spans.py's attributes)."""
    def kv(key, value):
        if isinstance(value, float):
            return KeyValue(key=key, value=AnyValue(double_value=value))
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        return KeyValue(key=key, value=AnyValue(string_value=value))
    attributes = [kv(k, v) for k, v in {
        "gen_ai.latency.time_to_first_token": 0.2, "gen_ai.latency.e2e": 1.5,
        "gen_ai.latency.time_in_queue": 0.05, "gen_ai.usage.prompt_tokens": 512,
        "gen_ai.usage.completion_tokens": 64, "gen_ai.latency.time_in_model_prefill": 0.1,
        "gen_ai.latency.time_in_model_decode": 1.2, "gen_ai.latency.time_in_model_inference": 1.3,
        "gen_ai.request.id": "cmpl-0123456789abcdef", "gen_ai.response.finish_reasons": '["stop"]',
        "gen_ai.request.max_tokens": 64}.items()]
    spans = [Span(trace_id=os.urandom(16), span_id=os.urandom(8), parent_span_id=os.urandom(8),
                  name="llm_request", kind=Span.SPAN_KIND_SERVER,
                  start_time_unix_nano=time.time_ns(), end_time_unix_nano=time.time_ns(),
                  attributes=attributes) for _ in range(num_spans)]
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])]).SerializeToString()


def receiver_throughput(exports: int, num_spans: int, rounds: int) -> None:
    http_port, grpc_port = free_port(), free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tracer", "proxy", "--upstream", "http://127.0.0.1:9",
         "--served-model-name", MODEL, "--listen", f"127.0.0.1:{http_port}",
         "--otlp-grpc-listen", f"127.0.0.1:{grpc_port}", "--upstream-metrics-path", ""],
        cwd=ROOT, env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=30, trust_env=False) as client:
            while True:
                try:
                    if client.get(base + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proxy.poll() is not None:
                    raise SystemExit("the proxy did not start")
                time.sleep(0.1)
            bodies = [vllm_export(num_spans) for _ in range(8)]
            channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
            call = channel.unary_unary(GRPC_METHOD, request_serializer=None,
                                       response_deserializer=None)
            process = psutil.Process(proxy.pid)
            per_exports = max(1, exports // rounds)

            def http_batch():
                for i in range(per_exports):
                    assert client.post(base + "/v1/traces", content=bodies[i % 8], headers={
                        "content-type": "application/x-protobuf"}).status_code == 200

            def grpc_batch():
                for i in range(per_exports):
                    call(bodies[i % 8], timeout=30)

            results = {"http": [], "grpc": []}
            for _ in range(rounds):
                for name, batch in (("http", http_batch), ("grpc", grpc_batch)):
                    cpu0 = sum(process.cpu_times()[:2])
                    wall0 = time.perf_counter()
                    batch()
                    # The spans are joined after each export is answered: let the last finish.
                    time.sleep(0.05)
                    results[name].append((sum(process.cpu_times()[:2]) - cpu0,
                                          time.perf_counter() - wall0))
            channel.close()
        print(f"receiver: {rounds} interleaved rounds of {per_exports} exports x {num_spans} "
              "vLLM spans (unknown traces: decoded, adapted, counted)")
        spans = per_exports * num_spans
        for name, rows in results.items():
            # CPU time ticks at 10 ms: per core over all rounds; wall as the rounds' median.
            cpu_s = max(sum(r[0] for r in rows), 0.01)
            print(f"  {name:5s} {spans * len(rows) / cpu_s:>10,.0f} spans/s per core "
                  f"(proxy CPU)  {spans / statistics.median(r[1] for r in rows):>10,.0f} "
                  "spans/s wall")
    finally:
        proxy.terminate()
        proxy.wait(10)


def _request(tracer: Tracer, i: int):
    active = tracer.begin(request_id=f"r{i}", model=MODEL, operation="chat", traceparent=None,
                          start_ns=1_000 * MS)
    timeline = active.timeline
    timeline.mark("receive", 1_000 * MS + 200_000)
    timeline.mark("upstream_connect", 1_000 * MS + 300_000)
    timeline.mark("upstream_ttfb", 1_002 * MS)
    timeline.mark("upstream_first_token", 1_060 * MS)
    timeline.mark("send", 1_060 * MS + 50_000)
    timeline.emit(1_060 * MS + 50_000)
    return active


def join_cost(rounds: int, per_round: int) -> None:
    from prometheus_client import CollectorRegistry
    timing = EngineTiming("llamacpp", ttft_ns=40 * MS, prefill_ns=40 * MS,
                          num_prompt_tokens=100, num_cached_tokens=90)
    plain = Tracer(model_names=(MODEL,), stages=PROXY_STAGES)
    joined = Tracer(model_names=(MODEL,), stages=PROXY_STAGES)
    join = EngineJoin(joined, EngineTimingMetrics(CollectorRegistry()), receiving=True)
    kwargs = dict(end_ns=1_100 * MS, finish_reason="stop", num_output_tokens=8)

    def without():
        for i in range(per_round):
            plain.finish(_request(plain, i), **kwargs)

    def inband():
        for i in range(per_round):
            active = _request(joined, i)
            join.expect(active)
            join.finish(active, inband=timing, **kwargs)

    def no_signal():
        for i in range(per_round):
            active = _request(joined, i)
            join.expect(active)
            join.finish(active, **kwargs)

    cases = {"tracer only": without, "join, in-band signal": inband, "join, no signal": no_signal}
    per_request = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            start = time.perf_counter_ns()
            run()
            per_request[name].append((time.perf_counter_ns() - start) / per_round / 1e3)
    base = statistics.median(per_request["tracer only"])
    print(f"join cost per proxied request ({rounds} interleaved rounds of {per_round}, "
          "no sinks, one core):")
    for name, values in per_request.items():
        median = statistics.median(values)
        extra = "" if name == "tracer only" else f"  (+{median - base:.1f} µs)"
        print(f"  {name:22s} {median:7.1f} µs{extra}")


def pending_memory(max_pending: int) -> None:
    from prometheus_client import CollectorRegistry

    async def fill() -> tuple[int, int]:
        tracer = Tracer(model_names=(MODEL,), stages=PROXY_STAGES)
        join = EngineJoin(tracer, EngineTimingMetrics(CollectorRegistry()),
                          JoinSettings(wait_s=3600, max_pending=max_pending, spans_expected=True))
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(max_pending + max_pending // 10):   # 10 % over: the oldest go out
            active = _request(tracer, i)
            join.expect(active)
            join.finish(active, end_ns=1_100 * MS, finish_reason="stop")
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert join.num_pending == max_pending
        join.close()
        return after - before, join.num_pending

    used, _ = asyncio.run(fill())
    print(f"pending table at its bound ({max_pending:,} records, 10 % more offered): "
          f"{used / 2**20:.1f} MiB, {used / max_pending:,.0f} B per record")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=150)
    parser.add_argument("--spans", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--join-requests", type=int, default=2000)
    parser.add_argument("--max-pending", type=int, default=10_000)
    parser.add_argument("--skip-receiver", action="store_true")
    args = parser.parse_args(argv)
    join_cost(args.rounds, args.join_requests)
    pending_memory(args.max_pending)
    if not args.skip_receiver:
        receiver_throughput(args.exports, args.spans, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
