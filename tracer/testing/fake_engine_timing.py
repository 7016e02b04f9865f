"""The engine-specific timing the fake upstream answers with on request: llama.cpp's
`timings` object (`x-fake-mode: llamacpp`), TGI's timing headers (`tgi`), and a vLLM-style
`/metrics` page.

Apart from the server (tracer/testing/fake_upstream.py) because each imitates one real
engine's format, which changes with that engine (tracer/engines/ reads them); vLLM's
per-request metrics ride in a usage chunk of the stream itself, written there with the
stream's other chunks.
"""
from __future__ import annotations

from tracer.testing.fake_http import SeenRequest


def _llamacpp_timings(request: SeenRequest, num_chunks: int) -> dict:
    # The fields llama-server's `result_timings` writes (tracer/engines/llamacpp.py).
    prompt_ms = float(request.headers.get("x-fake-prompt-ms", 1.0))
    return {"prompt_n": 5, "prompt_ms": prompt_ms, "prompt_per_token_ms": prompt_ms / 5,
            "cache_n": int(request.headers.get("x-fake-cache-n", 0)),
            "predicted_n": num_chunks, "predicted_ms": 1.0}


def _tgi_headers(request: SeenRequest) -> bytes:
    total, validation, queue, inference = (int(v) for v in request.headers.get(
        "x-fake-tgi-ms", "4,1,1,2").split(","))
    return (b"x-total-time: %d\r\nx-validation-time: %d\r\nx-queue-time: %d\r\n"
            b"x-inference-time: %d\r\nx-time-per-token: 1\r\nx-prompt-tokens: 5\r\n"
            % (total, validation, queue, inference))


# A vLLM-style exposition (docs/reference.md, "Engines' metric names") for the re-export test.
FAKE_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="fake-model"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="fake-model"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="fake-model"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="fake-model"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="fake-model"} 0.45
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="fake-model"} 42.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.5
"""
