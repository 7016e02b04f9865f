"""The `llm_*` families labelled by `model` alone (docs/reference.md, "Metrics"), defined once
and bound per served model up front, so that `LLMMetrics` (tracer/sinks/metrics.py) reaches a
request's children with one dict lookup and never calls `.labels()` on the hot path.

>>> from prometheus_client import CollectorRegistry
>>> children = model_children(CollectorRegistry(), ("smollm2", "other"))
>>> sorted(children), type(children["other"]).__name__
(['other', 'smollm2'], 'ModelChildren')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tracer.record.buckets import (
    HELD_BACK_BUCKETS_S,
    ITL_BUCKETS_S,
    MAX_GAP_BUCKETS_S,
    NETWORK_OVERHEAD_BUCKETS_S,
    RENDER_DELAY_BUCKETS_S,
    TTFT_BUCKETS_S,
)
from tracer.record.emits import MAX_SEND_TIMES


@dataclass(slots=True, frozen=True)
class ModelChildren:
    """The pre-bound children of one model, one field per family of `_families`."""

    itl: object
    prompt_tokens: object
    cached_tokens: object
    generation_tokens: object
    running: object
    waiting: object
    kv_usage: object
    client_ttft: object
    network_overhead: object
    render_delay: object
    max_gap: object
    client_itl: object
    client_buffered: object
    client_held_back: object


def model_children(registry: CollectorRegistry, models: Sequence[str]) -> dict[str, ModelChildren]:
    """Defines the families on `registry` and binds every one of them to each of `models`."""
    # A family without its field, or a field without its family, is a TypeError here.
    families = _families(registry)
    return {m: ModelChildren(**{name: family.labels(m) for name, family in families.items()})
            for m in models}


def _families(r: CollectorRegistry) -> dict:
    """The model-labelled families, by their `ModelChildren` field."""
    m = ("model",)
    return dict(
        itl=Histogram("llm_inter_token_latency_seconds", "Gap between consecutive emitted "
                      "content chunks", m, registry=r, buckets=ITL_BUCKETS_S),
        prompt_tokens=Counter("llm_prompt_tokens_total", "Prompt tokens of finished requests",
                              m, registry=r),
        cached_tokens=Counter("llm_prompt_cached_tokens_total", "Prompt tokens served from the "
                              "prefix cache", m, registry=r),
        generation_tokens=Counter("llm_generation_tokens_total", "Generated tokens of finished "
                                  "requests", m, registry=r),
        running=Gauge("llm_requests_running", "Requests in the running batch", m, registry=r),
        waiting=Gauge("llm_requests_waiting", "Requests waiting to be scheduled", m, registry=r),
        kv_usage=Gauge("llm_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0-1)",
                       m, registry=r),
        client_ttft=Histogram("llm_client_time_to_first_token_seconds", "Client-side time to "
                              "first token, from probe beacons", m, registry=r,
                              buckets=TTFT_BUCKETS_S),
        network_overhead=Histogram("llm_client_network_overhead_seconds", "Client TTFT minus "
                                   "server TTFT: network and gateways", m, registry=r,
                                   buckets=NETWORK_OVERHEAD_BUCKETS_S),
        render_delay=Histogram("llm_client_render_delay_seconds", "First token received to "
                               "first paint in the browser", m, registry=r,
                               buckets=RENDER_DELAY_BUCKETS_S),
        max_gap=Histogram("llm_stream_max_gap_seconds", "The largest gap between consecutive "
                          "emitted content chunks of one request", m, registry=r,
                          buckets=MAX_GAP_BUCKETS_S),
        client_itl=Histogram("llm_client_itl_seconds", "Gap between consecutive content chunks "
                             f"as the browser received them (the first {MAX_SEND_TIMES} chunks, "
                             "probe beacons)", m, registry=r, buckets=ITL_BUCKETS_S),
        client_buffered=Counter("llm_client_stream_buffered", "Streams an intermediary held "
                                "back: their first content events arrived together though "
                                "sent apart (probe beacons)", m, registry=r),
        client_held_back=Histogram("llm_client_stream_held_back_seconds", "Send spread of a "
                                   "stream's first content events not seen as arrival spread "
                                   "in the browser; one observation per stream that could be "
                                   "judged (3+ events)", m, registry=r,
                                   buckets=HELD_BACK_BUCKETS_S),
    )
