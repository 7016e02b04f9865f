"""Prometheus metrics of docs/reference.md, "Metrics", with `trace_id`/`span_id` exemplars on
the latency histograms.

Cardinality is closed: every label value is a served model name, a stage, a finish reason, an
error type or a beacon outcome from a fixed list; anything else becomes `"other"`. A request
cannot add a series. All children are created up front, so every series exists from the first
scrape and `observe_request` only calls pre-bound children (~0.8 µs an observation, ~2.3 µs
with an exemplar, docs/reference.md, "Costs"). A finished request's ~16 observations go through
`observe_with`, not `Histogram.observe`: the same bucket, sum and exemplar writes, without the
per-call exemplar validation (its labels are validated once, by `exemplar_for`), the linear
bucket scan and a clock read per observation (one per record: its exemplars share a
timestamp); tests/tracer/test_metrics.py checks the exposition equals `observe`'s.

Label names: the `gen_ai_server_*` histograms use the semconv-derived `gen_ai_request_model`,
`gen_ai_operation_name` and `error_type`; the `llm_*` metrics use `model`. `error_type` is the
empty string for a request that did not fail (an absent attribute in OTel terms: in PromQL
`error_type=""` matches it, `error_type!=""` selects failures). There is no `source` label
(engine vs proxy): each process exports one source, which Prometheus tells apart by `job`.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder

from tracer.record.buckets import (
    LOOP_LAG_BUCKETS_S,
    REQUEST_DURATION_BUCKETS_S,
    STAGE_BUCKETS_S,
    TPOT_BUCKETS_S,
    TTFT_BUCKETS_S,
)
from tracer.record.causes import CAUSE_NAMES
from tracer.record.errors import ERROR_TYPES, error_type_of
from tracer.record.labels import (
    CACHE_OUTCOMES,
    OTHER,
    PROMPT_LEN_BUCKETS,
    cache_outcome,
    model_label,
    prompt_len_bucket,
)
from tracer.record.request_record import RequestRecord
from tracer.record.stages import (FINISH_REASONS, OPERATIONS, OUTPUT_SEGMENTS, SERVER_STAGES,
                                  UNATTRIBUTED)
from tracer.record.token_counts import TOKEN_KINDS, invalid_kinds
from tracer.sinks.client_metrics import ClientMetrics
from tracer.sinks.draft_metrics import DraftMetrics
from tracer.sinks.gap_histogram import WRITE_NOW, add_gap_summary
from tracer.sinks.observation_batch import ObservationBatch
from tracer.sinks.model_metrics import model_children
from tracer.sinks.output_metrics import OutputMetrics

NO_ERROR = ""
# rejected_token: no or a wrong beacon token (tracer/web/probe/token.py); rejected_signature:
# an in-band timing token (`server`) forged, malformed or of another trace (tracer/web/
# inband.py); relayed: sent on to the collector owning its trace (tracer/collect/beacon_relay.py).
BEACON_OUTCOMES = ("accepted", "rejected_schema", "rejected_size", "rejected_token",
                   "rejected_signature", "rate_limited", "unmatched", "relayed")
_EXEMPLAR_MAX_CHARS = 128  # OpenMetrics: label names + values of one exemplar


class LLMMetrics:
    """The serving metrics of one process, on an injectable registry.

    >>> from prometheus_client import CollectorRegistry
    >>> metrics = LLMMetrics(CollectorRegistry(), model_names=["smollm2"])
    >>> metrics.set_engine_state("smollm2", num_running=1, num_waiting=0, kv_usage_ratio=0.25)
    >>> body, content_type = metrics.exposition("application/openmetrics-text")
    >>> b"llm_kv_cache_usage_ratio" in body
    True
    """

    name = "metrics"   # in the tracer's sink failure counts

    def __init__(self, registry: CollectorRegistry | None = None, model_names: Sequence[str] = (),
                 *, stages: Sequence[str] = SERVER_STAGES,
                 error_types: Sequence[str] = ERROR_TYPES, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._drain: Callable[[], object] | None = None   # `bind_drain`
        if process_metrics:
            # process_cpu_seconds_total & co. (read from /proc at scrape time; none elsewhere):
            # a CPU-starved server shows "high TTFT, idle GPU", and this is the evidence.
            ProcessCollector(registry=self.registry)
        self.models = _closed(model_names)
        self.operations = _closed(OPERATIONS)
        # The stages, the output segments after them (tracer/record/output_segments.py), and
        # the time no stage covers.
        self.stages = _closed(tuple(stages) + OUTPUT_SEGMENTS + (UNATTRIBUTED,))
        self.finish_reasons = _closed(FINISH_REASONS)
        self.error_types = (NO_ERROR,) + _closed(error_types)
        self.outcomes = _closed(BEACON_OUTCOMES)
        # `model_label(m, self.models)` as one dict lookup, the per-request fast path:
        # `self._model_of.get(m, OTHER)` is a served name, else OTHER.
        self._model_of = {m: model_label(m, self.models) for m in self.models}
        self._op_of = {o: o for o in self.operations}
        self._stage_of = {s: s for s in self.stages}
        self._finish_of = {f: f for f in self.finish_reasons}
        self._error_of = {e: e for e in self.error_types}
        self._outcome_of = {o: o for o in self.outcomes}
        self._define_genai()
        self._define_llm()
        self._define_splits()
        self._define_causes()

    def _define_genai(self) -> None:
        r, genai = self.registry, ("gen_ai_request_model", "gen_ai_operation_name")
        ttft = Histogram("gen_ai_server_time_to_first_token_seconds", "Server time to first token "
                         "(gen_ai.server.time_to_first_token)", genai, registry=r, buckets=TTFT_BUCKETS_S)
        tpot = Histogram("gen_ai_server_time_per_output_token_seconds", "Server time per output "
                         "token after the first (gen_ai.server.time_per_output_token)", genai,
                         registry=r, buckets=TPOT_BUCKETS_S)
        duration = Histogram("gen_ai_server_request_duration_seconds", "Server request duration "
                             "(gen_ai.server.request.duration)", genai + ("error_type",),
                             registry=r, buckets=REQUEST_DURATION_BUCKETS_S)
        self._ttft_tpot = {(m, o): (ttft.labels(m, o), tpot.labels(m, o))
                           for m in self.models for o in self.operations}
        self._duration = {(m, o, e): duration.labels(m, o, e) for m in self.models
                          for o in self.operations for e in self.error_types}

    def _define_llm(self) -> None:
        r = self.registry
        stage = Histogram("llm_request_stage_duration_seconds", "Time spent in each server "
                          "stage before the first token", ("stage",), registry=r, buckets=STAGE_BUCKETS_S)
        requests = Counter("llm_requests_total", "Finished requests by finish reason",
                           ("model", "finish_reason"), registry=r)
        beacons = Counter("llm_probe_beacons_total", "Probe beacons received, by outcome",
                          ("outcome",), registry=r)
        invalid = Counter("llm_invalid_token_counts_total", "Token counts outside 0 … 10^7 "
                          "per request, left out of the token counters", ("kind",), registry=r)
        self._invalid_tokens = {k: invalid.labels(k) for k in TOKEN_KINDS}
        self._stage = {s: stage.labels(s) for s in self.stages}
        self._requests = {(m, f): requests.labels(m, f) for m in self.models for f in self.finish_reasons}
        self._beacons = {o: beacons.labels(o) for o in self.outcomes}
        self._by_model = model_children(r, self.models)
        self._client = ClientMetrics(r, self.models, self._by_model)
        self._outputs = OutputMetrics(r, self.models)
        self._drafts = DraftMetrics(r, self.models)
        # The batch `collect` fills and `flush_batch` writes: one per thread, so two
        # workers publishing to one LLMMetrics never write each other's half batch.
        self._batches = threading.local()

    def _define_splits(self) -> None:
        """TTFT by cache outcome and by prompt length as their own histograms, not as labels on
        the semconv TTFT histogram: that one keeps its standard label set (what semconv-aware
        tools and the recording rules expect) and its series count, and the two splits add
        3 + 5 children per model instead of multiplying it by 3 x 5 (docs/reference.md,
        "Metrics")."""
        r, m = self.registry, self.models
        by_cache = Histogram("llm_ttft_by_cache_seconds", "Server TTFT by prefix-cache outcome "
                             "(hit, partial, miss)", ("model", "cache"), registry=r,
                             buckets=TTFT_BUCKETS_S)
        by_len = Histogram("llm_ttft_by_prompt_len_seconds", "Server TTFT by prompt-length "
                           "bucket", ("model", "prompt_len"), registry=r, buckets=TTFT_BUCKETS_S)
        lag = Histogram("llm_event_loop_lag_seconds", "How late the asyncio event loop woke a "
                        "periodic timer: time every request waits before the loop serves it",
                        registry=r, buckets=LOOP_LAG_BUCKETS_S)
        self._ttft_by_cache = {(x, c): by_cache.labels(x, c) for x in m for c in CACHE_OUTCOMES}
        self._ttft_by_len = {(x, b): by_len.labels(x, b) for x in m
                             for b, _ in PROMPT_LEN_BUCKETS}
        self._loop_lag = lag

    def _define_causes(self) -> None:
        """The TTFT verdicts (tracer/record/verdict.py) by cause: how many, and the TTFT
        seconds each cause cost above normal. The cause label is the closed vocabulary of
        tracer/record/causes.py."""
        r, causes = self.registry, _closed(CAUSE_NAMES)
        count = Counter("llm_ttft_cause", "Requests by the cause of their TTFT verdict "
                        "(healthy: nothing above normal; unjudged: too little history to "
                        "say)", ("model", "cause"), registry=r)
        excess = Counter("llm_ttft_excess_seconds", "TTFT above normal explained by each "
                         "verdict's cause", ("model", "cause"), registry=r)
        self._cause = {(m, c): (count.labels(m, c), excess.labels(m, c))
                       for m in self.models for c in causes}
        self._cause_of = {c: c for c in causes}

    def observe_verdict(self, model: str, verdict, batch: ObservationBatch | None = None) -> None:
        """One verdict (`tracer.record.verdict.Verdict`): counted under its cause, its excess
        added; into `batch` when given. Called by `publish` for the server's verdict, and by
        the beacon join when the browser's side (network, buffering) becomes the cause."""
        model = self._model_of.get(model, OTHER)
        count, excess = self._cause[model, self._cause_of.get(verdict.cause, OTHER)]
        inc = (batch or WRITE_NOW).inc
        inc(count._value, 1)   # the counters' own values, as the record's counts (>= 0)
        if verdict.excess_ns:
            inc(excess._value, max(verdict.excess_ns, 0) * 1e-9)

    def publish(self, record: RequestRecord) -> None:
        self.observe_request(record)
        if record.verdict is not None:     # only a record with a first token has one
            self.observe_verdict(record.model, record.verdict)

    def collect(self, record: RequestRecord) -> None:
        """`publish`, held in this batch until `flush_batch` (a `BatchSink`,
        tracer/core/sink.py: the worker's batches)."""
        batch = getattr(self._batches, "batch", None)
        if batch is None:
            batch = self._batches.batch = ObservationBatch()
        self.observe_request(record, batch)
        if record.verdict is not None:     # only a record with a first token has one
            self.observe_verdict(record.model, record.verdict, batch)

    def flush_batch(self) -> None:
        batch = getattr(self._batches, "batch", None)
        if batch is not None:
            batch.apply()

    def observe_request(self, record: RequestRecord,
                        batch: ObservationBatch | None = None) -> None:
        """Everything one finished request contributes; call once per request. Into `batch`
        when given (written by its `apply`), else now."""
        writes = batch or WRITE_NOW
        observe, inc = writes.observe, writes.inc
        model = self._model_of.get(record.model, OTHER)
        op = self._op_of.get(record.operation, OTHER)
        exemplar = exemplar_for(record.trace_id, record.span_id)
        now = time.time()   # one timestamp for the record's exemplars
        ttft, tpot = self._ttft_tpot[model, op]
        if record.ttft_ns is not None:
            ttft_s = record.ttft_ns * 1e-9
            observe(ttft, ttft_s, exemplar, now)
            observe(self._stage[UNATTRIBUTED], max(record.unattributed_ns, 0) * 1e-9,
                    exemplar, now)
            n_prompt = record.num_prompt_tokens
            # 0 prompt tokens means "not reported" (a proxy whose upstream sent no usage):
            # left out of the splits rather than guessed into `miss` / `lt256`.
            if n_prompt > 0:
                cache = cache_outcome(n_prompt, record.num_cached_tokens)
                observe(self._ttft_by_cache[model, cache], ttft_s, exemplar, now)
                observe(self._ttft_by_len[model, prompt_len_bucket(n_prompt)], ttft_s,
                        exemplar, now)
        tpot_ns = record.tpot_ns
        if tpot_ns is not None:
            observe(tpot, tpot_ns * 1e-9, exemplar, now)
        error = error_type_of(record)
        error = NO_ERROR if error is None else self._error_of.get(error, OTHER)
        observe(self._duration[model, op, error], record.e2e_ns * 1e-9, exemplar, now)
        self._outputs.observe(model, record, exemplar, now, writes)
        self._drafts.observe(model, record, writes)
        stage_of, stage_children = self._stage_of, self._stage
        for span in record.stages:
            observe(stage_children[stage_of.get(span.stage, OTHER)],
                    (span.end_ns - span.start_ns) * 1e-9, exemplar, now)
        children = self._by_model[model]
        gaps = record.itl
        if gaps.count:
            add_gap_summary(children.itl, gaps, exemplar)
            observe(children.max_gap, gaps.max_ns * 1e-9, exemplar, now)
        for kind in invalid_kinds(record.attrs):   # their counts are 0 on the record
            self._invalid_tokens[kind].inc()
        # Counts checked >= 0 by the record (tracer/record/token_counts.py): the value's own
        # `inc`, without the counter's sign and exemplar checks.
        inc(children.prompt_tokens._value, record.num_prompt_tokens)
        inc(children.cached_tokens._value, record.num_cached_tokens)
        inc(children.generation_tokens._value, record.num_output_tokens)
        inc(self._requests[model, self._finish_of.get(record.finish_reason, OTHER)]._value, 1)

    def set_engine_state(self, model: str, num_running: int, num_waiting: int,
                         kv_usage_ratio: float) -> None:
        children = self._by_model[self._model_of.get(model, OTHER)]
        children.running.set(num_running)
        children.waiting.set(num_waiting)
        children.kv_usage.set(kv_usage_ratio)

    def observe_client(self, model: str, client_ttft_s: float | None,
                       network_overhead_s: float | None, render_delay_s: float | None,
                       trace_id: str | None = None, *,
                       stages_s: Mapping[str, float] | None = None,
                       itl_s: Sequence[float] = ()) -> None:
        """One probe beacon's client-side numbers (tracer/sinks/client_metrics.py)."""
        self._client.observe(self._model_of.get(model, OTHER), client_ttft_s,
                             network_overhead_s, render_delay_s, exemplar_for(trace_id, None),
                             stages_s=stages_s, itl_s=itl_s)

    def observe_buffering(self, model: str, buffered: bool, held_back_s: float,
                          trace_id: str | None = None) -> None:
        """One judged stream (tracer/sinks/client_metrics.py)."""
        self._client.observe_buffering(self._model_of.get(model, OTHER), buffered, held_back_s,
                                       exemplar_for(trace_id, None))

    def observe_loop_lag(self, lag_s: float) -> None:
        """One event-loop wake-up, `lag_s` after its deadline (tracer/web/loop_lag.py)."""
        self._loop_lag.observe(max(lag_s, 0.0))

    def count_beacon(self, outcome: str) -> None:
        self._beacons[self._outcome_of.get(outcome, OTHER)].inc()

    def bind_drain(self, drain: Callable[[], object]) -> None:
        """Run `drain` before every read of the registry, so a scrape counts every request
        finished before it. Bound once, by `build_observability`: the drain is the tracer's,
        and the tracer is built after these metrics because its worker feeds them.

        >>> metrics = LLMMetrics(process_metrics=False); metrics.bind_drain(lambda: None)
        >>> metrics.bind_drain(lambda: None)
        Traceback (most recent call last):
        RuntimeError: the metrics' drain is already bound
        """
        if self._drain is not None:
            raise RuntimeError("the metrics' drain is already bound")
        self._drain = drain

    def exposition(self, accept_header: str | None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics with exemplars when asked for, else classic text."""
        if self._drain is not None:
            self._drain()
        encoder, content_type = choose_encoder(accept_header or "")
        return encoder(self.registry), content_type


def exemplar_for(trace_id: str | None, span_id: str | None) -> dict | None:
    """`{"trace_id", "span_id"}` within OpenMetrics' 128-character limit, dropping what doesn't fit."""
    if not trace_id:
        return None
    size = len("trace_id") + len(trace_id)
    if size > _EXEMPLAR_MAX_CHARS:
        return None
    if span_id and size + len("span_id") + len(span_id) <= _EXEMPLAR_MAX_CHARS:
        return {"trace_id": trace_id, "span_id": span_id}
    return {"trace_id": trace_id}


def _closed(values: Sequence[str]) -> tuple[str, ...]:
    """Distinct values in order, with the catch-all `other` last."""
    out = tuple(dict.fromkeys(v for v in values if v != OTHER))
    return out + (OTHER,)
