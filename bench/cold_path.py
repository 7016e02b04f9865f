"""What the proxy's steps before the request goes upstream cost hot, and after the CPU idled.

    .venv/bin/python bench/cold_path.py [--idle-ms 20] [--samples 60]

At one stream the proxy's TTFT overhead is mostly not its hot CPU cost: between a stream's
events the CPU idles, and the first microseconds of work after that run with cold caches
(and, on a VM, a vCPU woken again). Each step below runs `--samples` times right after a
sleep of `--idle-ms` (as between events 20 ms apart), and hot in a loop; the table prints
the medians, the ratio, and the same for a step that does almost nothing (`noop`: the wake
itself). In-process: the proxy app is built as the CLI builds it (spans exported to an
unreachable endpoint, so the exporter exists but nothing is sent).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def steps() -> dict:
    """The proxy's pre-upstream steps, each as a zero-argument call."""
    sys.path.insert(0, str(ROOT))
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://127.0.0.1:9/v1/traces"
    from tracer.proxy.app import ProxySettings, create_proxy_app
    from tracer.proxy.headers import forward_headers
    from tracer.proxy.serving import _REPLACED_REQUEST_HEADERS, peek_request
    from tracer.record.ids import new_request_id

    parts = create_proxy_app(ProxySettings("http://127.0.0.1:9"), model_names=("m",))
    tracer = parts.obs.tracer
    body = (b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],'
            b'"max_tokens":16}')
    headers = [(b"host", b"127.0.0.1:8100"), (b"content-type", b"application/json"),
               (b"content-length", b"%d" % len(body))]
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"

    def begin():
        return tracer.begin(request_id="r", model="m", operation="chat", traceparent=None,
                            start_ns=time.perf_counter_ns(), attrs={"stream": True})
    return {
        "noop": lambda: None,
        "peek_request (JSON)": lambda: peek_request(body),
        "new_request_id": lambda: new_request_id("proxy"),
        "Tracer.begin (span ids, sampler)": begin,
        "beacon token (HMAC)": lambda: parts.obs.beacon_signer.token(trace_id),
        "forward_headers": lambda: forward_headers(headers, drop=_REPLACED_REQUEST_HEADERS),
        "upstream request bytes": lambda: parts.upstream.exchange(
            "POST", "/v1/chat/completions", b"",
            [("content-type", "application/json"), ("traceparent", traceparent)], body),
    }


def measure(calls: dict, idle_s: float, samples: int, hot_calls: int = 2000) -> list[tuple]:
    cold = {name: [] for name in calls}
    for _ in range(samples):          # interleaved: every step sees the same machine state
        for name, call in calls.items():
            time.sleep(idle_s)
            start = time.perf_counter_ns()
            call()
            cold[name].append(time.perf_counter_ns() - start)
    rows = []
    for name, call in calls.items():
        for _ in range(100):
            call()
        start = time.perf_counter_ns()
        for _ in range(hot_calls):
            call()
        hot_ns = (time.perf_counter_ns() - start) / hot_calls
        rows.append((name, hot_ns / 1e3, statistics.median(cold[name]) / 1e3))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-ms", type=float, default=20.0)
    parser.add_argument("--samples", type=int, default=60)
    args = parser.parse_args(argv)
    rows = measure(steps(), args.idle_ms / 1e3, args.samples)
    print(f"the proxy's steps before the upstream write: hot, and after {args.idle_ms:g} ms "
          f"idle (median of {args.samples})")
    print(f"{'step':>34}  {'hot us':>8}  {'after idle us':>13}  {'ratio':>6}")
    for name, hot_us, cold_us in rows:
        print(f"{name:>34}  {hot_us:8.2f}  {cold_us:13.1f}  {cold_us / max(hot_us, 1e-3):5.0f}x")
    total_hot = sum(hot for name, hot, _ in rows if name != "noop")
    total_cold = sum(cold for name, _, cold in rows if name != "noop")
    print(f"{'sum of the steps':>34}  {total_hot:8.2f}  {total_cold:13.1f}  "
          f"(each step after its own idle; in a request they share one wake-up)")


if __name__ == "__main__":
    main()
