"""The name and attributes of a request's spans: the GenAI semantic conventions on the
request span (its name and the attributes it starts with, then those of its
`RequestRecord`), the prefill stage's token counts and rates, and the rule that makes any
value OTel-valid (docs/reference.md, "Spans", "OTel GenAI semantic conventions").
Pure functions: `spans.py` builds the spans around them.
"""
from __future__ import annotations

from opentelemetry.sdk.trace import Event

from tracer.record.request_record import RequestRecord

PROVIDER_NAME = "ttftscope"
_ATTR_SCALARS = (str, bool, int, float)


def request_span_name(operation: str, model: str) -> str:
    """`{gen_ai.operation.name} {gen_ai.request.model}`; `model` is a label already
    (tracer.record.labels.model_label).

    >>> request_span_name("chat", "smollm2")
    'chat smollm2'
    """
    return f"{operation} {model}"


def request_attributes(operation: str, model: str) -> dict:
    """The GenAI attributes a request span starts with, known before the request runs, so
    the sampler sees them (docs/reference.md, "OTel GenAI semantic conventions").

    >>> request_attributes("chat", "smollm2")["gen_ai.provider.name"]
    'ttftscope'
    """
    return {"gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": model}


def genai_attributes(record: RequestRecord) -> dict:
    """The GenAI semconv attributes of the finished request span: those it started with,
    then usage, finish reasons, TTFT (docs/reference.md, "OTel GenAI semantic conventions").
    The span applies them last, so no free-form attribute of the request renames its model."""
    attrs = request_attributes(record.operation, record.model)
    attrs.update({
        "gen_ai.usage.input_tokens": record.num_prompt_tokens,
        "gen_ai.usage.output_tokens": record.num_output_tokens,
        "gen_ai.response.finish_reasons": (record.finish_reason,),
        "llm.request_id": record.request_id,
        "llm.num_cached_tokens": record.num_cached_tokens,
        "llm.source": record.source,
    })
    stream = record.attrs.get("stream")
    if isinstance(stream, bool):
        attrs["gen_ai.request.stream"] = stream
    if record.ttft_ns is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = record.ttft_ns / 1e9
        attrs["llm.unattributed_s"] = record.unattributed_ns / 1e9
        if record.source == "engine":
            attrs.update(vllm_latency_attributes(record))
        attrs.update(verdict_attributes(record.verdict))
    return attrs


def verdict_attributes(verdict) -> dict:
    """`llm.ttft.cause`, `llm.ttft.excess_ms` and one `llm.ttft.evidence.<key>` per number
    of the verdict (tracer/record/verdict.py); nothing before the record was judged.

    >>> from tracer.record.verdict import Verdict
    >>> verdict_attributes(Verdict("queueing", 5_000_000, {"queue_ms": 6.0, "x": None}, (), 9))
    {'llm.ttft.cause': 'queueing', 'llm.ttft.excess_ms': 5.0, 'llm.ttft.evidence.queue_ms': 6.0}
    """
    if verdict is None:
        return {}
    attrs = {"llm.ttft.cause": verdict.cause}
    if verdict.excess_ms is not None:
        attrs["llm.ttft.excess_ms"] = verdict.excess_ms
    for key, value in verdict.evidence.items():
        if isinstance(value, _ATTR_SCALARS):
            attrs[f"llm.ttft.evidence.{key}"] = value
    return attrs


def vllm_latency_attributes(record: RequestRecord) -> dict:
    """Our engine's numbers under vLLM's `gen_ai.latency.*` keys and units (seconds; vLLM's
    vllm/v1/engine/output_processor.py `do_tracing`), so a query over vLLM's spans reads ours
    too. Not on a proxy's span: a proxy's stages are not an engine's queue and prefill (and a
    proxy's span must not pass for an engine's at another proxy's receiver).

    vLLM's time to first token ends when its output processor takes the first token, before
    detokenizing it and before any HTTP write; ours, under its key, ends with the `sample`
    stage for the same reason. A proxy in front compares it with the time it waited for the
    first bytes (tracer/proxy/engine_join.py), which a TTFT that includes the engine's own
    write can exceed. Our TTFT to the first text handed to the transport stays
    `gen_ai.response.time_to_first_chunk`.

    >>> from tracer.record.request_record import StageSpan
    >>> r = RequestRecord("r", "0" * 32, "0" * 16, "m", "chat", 0, 90, ttft_ns=60,
    ...                   stages=(StageSpan("sample", 10, 40), StageSpan("send", 50, 60)))
    >>> vllm_latency_attributes(r)["gen_ai.latency.time_to_first_token"] * 1e9
    40.0
    """
    first_token_ns = next((s.end_ns for s in record.stages if s.stage == "sample"), None)
    ttft_ns = record.ttft_ns if first_token_ns is None else first_token_ns - record.start_ns
    attrs = {"gen_ai.latency.time_to_first_token": ttft_ns / 1e9,
             "gen_ai.latency.e2e": record.e2e_ns / 1e9}
    for stage, key in (("queue", "gen_ai.latency.time_in_queue"),
                       ("prefill", "gen_ai.latency.time_in_model_prefill")):
        ns = record.stage_ns(stage)
        if ns is not None:
            attrs[key] = ns / 1e9
    return attrs


def prefill_attributes(attrs: dict, record: RequestRecord, events: list[Event],
                      duration_ns: int = 0) -> None:
    """The prefill span's attributes that the timeline did not set explicitly, derived from
    the record and its chunk events (in place)."""
    attrs.setdefault("llm.num_prompt_tokens", record.num_prompt_tokens)
    attrs.setdefault("llm.num_cached_tokens", record.num_cached_tokens)
    _prefill_rates(attrs, events, duration_ns)
    if events:
        attrs.setdefault("llm.num_chunks", len(events))
        sizes = [e.attributes.get("batch_size") for e in events if e.attributes]
        sizes = [s for s in sizes if isinstance(s, int)]
        if sizes:
            attrs.setdefault("llm.batch_size", max(sizes))


def _prefill_rates(attrs: dict, events: list[Event], duration_ns: int) -> None:
    """Throughput of the prefill as this request saw it: its tokens and FLOPs over the
    stage's duration (waits between chunks included); and the device's rate, the FLOPs of
    the whole forward passes over their time (docs/reference.md, "Spans")."""
    if duration_ns > 0:
        tokens = sum(n for e in events
                     if isinstance(n := (e.attributes or {}).get("num_tokens"), int))
        if tokens:
            attrs["llm.prefill.tokens_per_s"] = tokens * 1e9 / duration_ns
        flops = attrs.get("llm.prefill.flops")
        if isinstance(flops, int) and flops > 0:
            attrs["llm.prefill.flop_per_s"] = flops * 1e9 / duration_ns
    step_flops = attrs.get("llm.prefill.step_flops")
    forward_ns = attrs.get("llm.prefill.forward_ns")
    if isinstance(step_flops, int) and isinstance(forward_ns, int) and forward_ns > 0:
        attrs["llm.prefill.device_flop_per_s"] = step_flops * 1e9 / forward_ns


def clean_attributes(attrs: dict | None, prefix: str) -> dict:
    """OTel-valid attributes: scalars and homogeneous sequences kept, None dropped, rest str().

    Keys without a dot get `prefix` (stage attrs from the timeline are plain words).
    """
    out = {}
    if not attrs:
        return out
    for key, value in attrs.items():
        if value is None:
            continue
        if prefix and "." not in key:
            key = prefix + key
        if isinstance(value, _ATTR_SCALARS):
            out[key] = value
        elif isinstance(value, (list, tuple)) and value and all(
                type(v) is type(value[0]) and isinstance(v, _ATTR_SCALARS) for v in value):
            out[key] = tuple(value)
        else:
            out[key] = str(value)
    return out
