"""The collector's whole-path join (`python -m tracer collect`): spans and beacons per second
per core on loopback, and its memory with 10,000 traces pending.

    .venv/bin/python bench/collector_path_bench.py [--traces 3000] [--pending 10000]

The real CLI runs as its own process, pinned to one CPU; the client (httpx, keep-alive, in
this process) on another. Each trace is what tests/integration/test_whole_path_fastapi.py's
backend and engine export: 7 backend spans (server root, auth, retrieve, its query, a
concurrent moderation, the response-start send span, the engine call) and vLLM's request
span, as one OTLP/protobuf export per trace, then the browser's beacon with the backend's
Server-Timing token. Each beacon completes its trace: the critical path is walked, the
record stored for /ui, the segment histograms and client metrics observed and the client
spans exported over OTLP (to an nginx sink, bench/lib/span_sink.py).

`--no-diagnosis` runs the collector without its whole-path verdicts
(tracer/collect/path_verdict.py): their cost is the difference, from runs alternated.

Printed: spans/s and beacons/s, each of wall time and per CPU-second of the collector (its
utime+stime from /proc); then its resident memory before and after `--pending` traces' spans
arrive with no beacon (held for `--join-wait-s 600`: the pending table at its bound).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402

from collector_bench import cpu_s, rss_mib, send  # noqa: E402
from bench.lib.loopback import free_port, wait_listening  # noqa: E402
from bench.lib.span_sink import span_sink  # noqa: E402
from tracer.engines.spans import request_from_json  # noqa: E402
from tracer.web.probe.token import BeaconSigner  # noqa: E402

KEY = "collector-path-bench-key"
PROTOBUF = "application/x-protobuf"
MODEL = "SmolLM2-135M-Instruct"
BROWSER = "b" * 16
MS = 1_000_000
VLLM = {"gen_ai.latency.time_to_first_token": 0.062, "gen_ai.latency.time_in_queue": 0.02,
        "gen_ai.latency.time_in_model_prefill": 0.04, "gen_ai.request.model": MODEL}
# (span id suffix, parent suffix, name, start ms, end ms, kind, service, attributes)
SHAPE = (("1", None, "POST /api/v1/chat/completions", 0, 300, 2, "api", {}),
         ("2", "1", "auth", 1, 5, 1, "api", {}),
         ("3", "1", "retrieve", 5, 40, 1, "api", {}),
         ("4", "3", "SELECT", 10, 35, 3, "api", {}),
         ("5", "1", "moderation", 6, 30, 1, "api", {}),
         ("6", "1", "POST /api/v1/chat/completions http send", 41, 41.02, 1, "api",
          {"asgi.event.type": "http.response.start"}),
         ("7", "1", "POST", 41, 290, 3, "api", {}),
         ("8", "7", "llm_request", 43, 280, 2, "vllm", VLLM))


def trace_export(i: int, base_ns: int) -> bytes:
    trace_id = f"{i + 1:032x}"
    sid = lambda suffix: f"{i + 1:014x}{int(suffix):02x}"
    by_service: dict[str, list] = {}
    for suffix, parent, name, start, end, kind, service, attrs in SHAPE:
        by_service.setdefault(service, []).append({
            "traceId": trace_id, "spanId": sid(suffix),
            "parentSpanId": BROWSER if parent is None else sid(parent), "name": name,
            "kind": kind, "startTimeUnixNano": str(base_ns + round(start * MS)),
            "endTimeUnixNano": str(base_ns + round(end * MS)),
            "attributes": [{"key": k, "value": {"doubleValue": v} if isinstance(v, float)
                            else {"stringValue": v}} for k, v in attrs.items()]})
    body = json.dumps({"resourceSpans": [
        {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": s}}]},
         "scopeSpans": [{"spans": spans}]} for s, spans in by_service.items()]}).encode()
    return request_from_json(body).SerializeToString()


def beacon(i: int, signer: BeaconSigner) -> bytes:
    trace_id = f"{i + 1:032x}"
    return json.dumps({
        "v": 1, "trace_id": trace_id, "traceparent": f"00-{trace_id}-{BROWSER}-01",
        "token": signer.token(trace_id), "outcome": "ok", "status": 200, "chunks": 8,
        "t": {"start": 0, "headers": 43.0, "first_byte": 319.0, "first_token": 320.0,
              "first_paint": 330.0, "end": 331.0}}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=3000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--no-diagnosis", action="store_true",
                        help="the collector without its whole-path verdicts (their cost: run "
                             "both, alternately)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cpus[0], cpus[-1]
    os.sched_setaffinity(0, {client_cpu})
    signer = BeaconSigner(KEY.encode())
    port = free_port()
    base_ns = time.time_ns() - 10_000 * MS
    warm = 200
    total = warm + args.traces
    exports = [trace_export(i, base_ns) for i in range(total + args.pending)]
    beacons = [beacon(i, signer) for i in range(total)]
    random.Random(0).shuffle(exports[total:])
    with tempfile.TemporaryDirectory() as tmp, span_sink(Path(tmp)) as traces_url:
        env = {**os.environ, "TTFTSCOPE_BEACON_KEY": KEY,
               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url}
        proc = subprocess.Popen(
            ["taskset", "-c", str(server_cpu), sys.executable, "-m", "tracer", "collect",
             "--listen", f"127.0.0.1:{port}", "--served-model-name", MODEL,
             "--join-wait-s", "600", "--max-pending-traces", str(max(args.pending, 1) + total),
             "--log-format", "json", *(["--no-diagnosis"] if args.no_diagnosis else [])],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port, proc)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                send(client, exports[:warm], 0, "/v1/traces", PROTOBUF, 200)
                send(client, beacons[:warm], 0)
                cpu0, t0 = cpu_s(proc.pid), time.perf_counter()
                send(client, exports[warm:total], warm, "/v1/traces", PROTOBUF, 200)
                span_wall, span_cpu = time.perf_counter() - t0, cpu_s(proc.pid) - cpu0
                cpu0, t0 = cpu_s(proc.pid), time.perf_counter()
                send(client, beacons[warm:total], warm)
                beacon_wall, beacon_cpu = time.perf_counter() - t0, cpu_s(proc.pid) - cpu0
                spans = args.traces * len(SHAPE)
                print(f"collector on loopback, one core, {args.traces:,} traces of "
                      f"{len(SHAPE)} spans (one OTLP/protobuf export each) and their beacons "
                      f"(keep-alive httpx client on another core):")
                print(f"  spans accepted      {spans / span_wall:>9,.0f} spans/s wall, "
                      f"{spans / span_cpu:,.0f} per CPU-second")
                print(f"  beacons joined      {args.traces / beacon_wall:>9,.0f} beacons/s wall, "
                      f"{args.traces / beacon_cpu:,.0f} per CPU-second (each completes its "
                      "trace's whole path)")
                before = rss_mib(proc.pid)
                send(client, exports[total:], total, "/v1/traces", PROTOBUF, 200)
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                pending = next(line for line in metrics.splitlines()
                               if line.startswith("llm_collector_pending_traces "))
                complete = next(line for line in metrics.splitlines()
                                if line.startswith('llm_collector_traces_total{outcome="complete"}'))
                print(f"collector memory (RSS) with traces pending ({pending}; {complete}):")
                print(f"  before              {before:>9.1f} MiB")
                print(f"  {args.pending:,} pending   {rss_mib(proc.pid):>9.1f} MiB")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
