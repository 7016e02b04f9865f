"""The browser's numbers, from probe beacons (docs/reference.md, "Metrics"): the client TTFT,
network overhead, render delay and chunk gaps, the stages from the user's Enter to the first
paint, and whether a stream was held back on its way. `LLMMetrics` (tracer/sinks/metrics.py)
owns the registry and the closed model labels and hands each beacon here.

The client families labelled by `model` alone live with the others in
tracer/sinks/model_metrics.py; this file adds the GenAI semconv client histograms and the
stage histogram, and observes all of them. Negative values (browser timer coarsening, clock
jitter) are recorded as 0: a negative observation would break Prometheus's counter-reset
detection on `_sum`.

>>> from prometheus_client import CollectorRegistry
>>> from tracer.sinks.model_metrics import model_children
>>> r = CollectorRegistry()
>>> client = ClientMetrics(r, ("smollm2", "other"), model_children(r, ("smollm2", "other")))
>>> client.observe("smollm2", 0.4, None, None, None, stages_s={"dns": 0.01})
>>> r.get_sample_value("llm_client_stage_duration_seconds_count",
...                    {"model": "smollm2", "stage": "dns"})
1.0
"""
from __future__ import annotations

from typing import Mapping, Sequence

from prometheus_client import CollectorRegistry, Histogram

from tracer.record.buckets import REQUEST_DURATION_BUCKETS_S, STAGE_BUCKETS_S
from tracer.sinks.gap_histogram import observe_gaps

# The client stages of `llm_client_stage_duration_seconds`, in the order they stack
# (docs/architecture.md, "The client stages"; tracer/web/probe/client_phases.py).
CLIENT_STAGE_LABELS = ("input", "dns", "tcp", "tls", "request", "first_byte", "first_token",
                       "first_paint")


class ClientMetrics:
    """A beacon's observations, on children bound up front for the closed `models`.
    `by_model`: `model_children`'s bundles of the same registry."""

    def __init__(self, registry: CollectorRegistry, models: Sequence[str],
                 by_model: Mapping[str, object]) -> None:
        self._by_model = by_model
        self._define_genai_client(registry, models)
        stage = Histogram("llm_client_stage_duration_seconds", "Browser-side stages, from the "
                          "user's Enter to the first paint (probe beacons)", ("model", "stage"),
                          registry=registry, buckets=STAGE_BUCKETS_S)
        self._stage = {(x, s): stage.labels(x, s) for x in models for s in CLIENT_STAGE_LABELS}

    def _define_genai_client(self, registry: CollectorRegistry, models: Sequence[str]) -> None:
        """The GenAI semconv client streaming metrics (semantic-conventions-genai, status
        Development): the probe's client TTFT and chunk gaps under the ecosystem's names, as
        well as under `llm_client_*` (which keep the TTFT ladder the alerts compare against).
        The semconv ladder is the request-duration one, 0.01 ... 81.92 s. Labelled by model
        only: a beacon knows its request's model, and the operation is not in the beacon."""
        m = ("gen_ai_request_model",)
        first = Histogram("gen_ai_client_operation_time_to_first_chunk_seconds", "Client time "
                          "to the first content chunk (gen_ai.client.operation."
                          "time_to_first_chunk), from probe beacons", m, registry=registry,
                          buckets=REQUEST_DURATION_BUCKETS_S)
        per = Histogram("gen_ai_client_operation_time_per_output_chunk_seconds", "Client time "
                        "between consecutive content chunks (gen_ai.client.operation."
                        "time_per_output_chunk), from probe beacons", m, registry=registry,
                        buckets=REQUEST_DURATION_BUCKETS_S)
        self._genai_client = {x: (first.labels(x), per.labels(x)) for x in models}

    def observe(self, model: str, client_ttft_s: float | None,
                network_overhead_s: float | None, render_delay_s: float | None,
                exemplar: dict | None, *, stages_s: Mapping[str, float] | None = None,
                itl_s: Sequence[float] = ()) -> None:
        """One beacon; `model` is a closed label, None means the browser did not report it.
        `stages_s`: client stage → seconds (any name outside `CLIENT_STAGE_LABELS` counts as
        nothing: the labels are closed). `itl_s`: the gaps between the first content chunks."""
        children = self._by_model[model]
        first_chunk, per_chunk = self._genai_client[model]
        for child, value in ((children.client_ttft, client_ttft_s),
                             (first_chunk, client_ttft_s),
                             (children.network_overhead, network_overhead_s),
                             (children.render_delay, render_delay_s)):
            if value is not None:
                child.observe(max(float(value), 0.0), exemplar)
        for stage, value in (stages_s or {}).items():
            child = self._stage.get((model, stage))
            if child is not None and value is not None:
                child.observe(max(float(value), 0.0), exemplar)
        if itl_s:
            gaps = [max(float(v), 0.0) for v in itl_s]
            observe_gaps(children.client_itl, gaps, exemplar)
            observe_gaps(per_chunk, gaps, exemplar)

    def observe_buffering(self, model: str, buffered: bool, held_back_s: float,
                          exemplar: dict | None) -> None:
        """One judged stream (tracer/web/probe/buffering.py): `held_back_s` always, the
        counter when it was held back. `rate(buffered_total) / rate(held_back_seconds_count)`
        is the share of judged streams that were buffered."""
        children = self._by_model[model]
        children.client_held_back.observe(max(float(held_back_s), 0.0), exemplar)
        if buffered:
            children.client_buffered.inc(1, exemplar)
