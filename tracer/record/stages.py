"""Stage names, in pipeline order: the contract of docs/architecture.md, "The stage contract"."""
from __future__ import annotations

# Server-side stages; each ends where the next begins, so their sum is the server TTFT.
SERVER_STAGES: tuple[str, ...] = (
    "receive", "template", "tokenize", "kv_lookup", "queue",
    "prefill", "sample", "detokenize", "send",
)
# Time inside TTFT that no recorded boundary covers. Tests assert it is zero for our engine.
UNATTRIBUTED = "unattributed"
ALL_STAGE_LABELS: tuple[str, ...] = SERVER_STAGES + (UNATTRIBUTED,)

# Stages a proxy in front of a foreign engine can see (the nine as seen from outside;
# docs/architecture.md, "The proxy's stages").
PROXY_STAGES: tuple[str, ...] = (
    "receive", "upstream_connect", "upstream_ttfb", "upstream_first_token", "send",
)

# A proxy record joined with the engine's own timing (tracer/engines, docs/architecture.md,
# "Inside the engine"): the upstream window (upstream_connect's end -> first content from the
# upstream) split into these, in this order. A record uses the subsequence its signal knows;
# `queue`, `prefill` and `tokenize` mean what they mean among the nine server stages.
#  - upstream_request: our request on its way and the engine's HTTP front before its arrival
#    stamp (placed by the engine's wall-clock arrival);
#  - upstream_other: the same plus the way back, for a signal with no arrival stamp (llama.cpp
#    timings, TGI headers): the engine's interval then ends at our first content;
#  - model_load: Ollama's `load_duration`: the scheduler's wait for a runner, which is the
#    model's load when it was not resident (tracer/engines/ollama.py);
#  - kv_transfer: with prefill/decode disaggregation, the prefill worker sending the
#    request's KV cache to the decode worker, after its prefill (tracer/engines/sglang_pd.py);
#    vLLM's decode instance waits for it before its own first step, its `prefill`, the one
#    place the order differs (tracer/engines/vllm.py);
#  - inference: TGI's x-inference-time (prefill and decode, non-streamed answers);
#  - engine_other: the part of the engine's own TTFT that its signal does not split;
#  - upstream_response: the engine's first token -> its bytes reaching us.
ENGINE_STAGES: tuple[str, ...] = (
    "receive", "upstream_connect", "upstream_request", "upstream_other", "tokenize", "queue",
    "model_load", "prefill", "kv_transfer", "inference", "engine_other", "upstream_response",
    "send",
)
# Every stage a proxy record may carry: the labels of its stage histogram.
PROXY_STAGE_LABELS: tuple[str, ...] = PROXY_STAGES + tuple(
    s for s in ENGINE_STAGES if s not in PROXY_STAGES)

# Client-side stages reported by the browser probe.
CLIENT_STAGES: tuple[str, ...] = (
    "client.request", "client.first_byte", "client.first_token", "client.first_paint",
)

# What a response's output is (docs/architecture.md, "First output, by kind"): answer text,
# a model's thinking, or a tool call (from its first delta that names the function). The
# stages end at the first output of any kind; a kind that comes before the first text fills
# a segment of its own, named after it, up to the next kind's first output.
OUTPUT_KINDS: tuple[str, ...] = ("text", "reasoning", "tool_call")
OUTPUT_SEGMENTS: tuple[str, ...] = ("reasoning", "tool_call")

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error")
OPERATIONS: tuple[str, ...] = ("chat", "text_completion")

# What a request is doing at a moment, on the timeline and in a neighbour's entry
# (docs/reference.md, "Timeline and neighbours"): receive..kv_lookup, the queue, the prefill
# (behind a proxy without engine timing: the upstream's first token), sample..send, and
# first token to the last byte.
PHASES: tuple[str, ...] = ("preprocess", "queue", "prefill", "first_token", "decode")
# The kinds of an engine step (instrumented_engine/engine/step_log.py, `EngineStep.kind`).
STEP_KINDS: tuple[str, ...] = ("prefill", "mixed", "decode")
