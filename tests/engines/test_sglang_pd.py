"""SGLang under prefill/decode disaggregation (tracer/engines/sglang_pd.py): the decode
worker's request span is the request, its prefill worker's stage spans give queue, prefill
and kv_transfer. The spans are made by the OpenTelemetry SDK as SGLang makes them
(tracer/testing/sglang_spans.py) and read back through OTLP's protobuf encoding, as the
receivers read them; hostile values never break the stage sum."""
from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.engines.detect import engine_timings, is_request_span
from tracer.engines.placement import place
from tracer.engines.spans import SpanView, request_from_protobuf, spans_of
from tracer.testing.sglang_spans import ROOM, PdTimeline, pd_request, worker_spans

MS = 10**6
ARRIVAL = 1_760_000_000 * 10**9
TTFT = 50 * MS
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
EXPECTED = PdTimeline().stage_ns(TTFT)   # tokenize 1 ms, queue 6, prefill 30, kv_transfer 7.9


class Worker:
    """One SGLang server's SDK: its spans, in memory, for one OTLP export."""

    def __init__(self) -> None:
        self.memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "sglang"}))
        provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = provider.get_tracer("sglang server")


def export(*workers: Worker) -> list[SpanView]:
    """The workers' spans as one OTLP export, read back as the receivers read it."""
    spans = [s for w in workers for s in w.memory.get_finished_spans()]
    return list(spans_of(request_from_protobuf(encode_spans(spans).SerializeToString())))


def pd(**kwargs) -> tuple[Worker, Worker, str, str]:
    prefill, decode = Worker(), Worker()
    kwargs.setdefault("traceparent", TRACEPARENT)
    ids = pd_request(prefill.tracer, decode.tracer, arrival_ns=ARRIVAL, ttft_ns=TTFT,
                     end_ns=ARRIVAL + 400 * MS, **kwargs)
    return prefill, decode, *ids


def placed_sum_intact(timing) -> None:
    """Placed in a window 2 ms wider than the engine's TTFT: contiguous, none negative,
    summing to the window; or refused with no stage at all."""
    start, end = ARRIVAL - MS, ARRIVAL + TTFT + MS
    placement = place(timing, window_start_ns=start, window_end_ns=end,
                      to_perf_ns=lambda ns: ns, max_skew_ns=0)
    if not placement.stages:
        assert placement.kind == "inconsistent"
        return
    bounds = (start, *placement.ends_ns)
    assert all(b >= a for a, b in zip(bounds, bounds[1:]))
    assert placement.ends_ns[-1] == end


def test_a_disaggregated_request_is_its_decode_span_with_the_prefill_workers_stages():
    prefill, decode, prefill_id, decode_id = pd()
    spans = export(prefill, decode)
    (span, timing), = engine_timings(spans)
    assert (span.span_id, span.name) == (decode_id, "decode Req e03d5a7c")
    assert timing.parts() == tuple((s, EXPECTED[s]) for s in (
        "tokenize", "queue", "prefill", "kv_transfer"))
    assert (timing.ttft_ns, timing.arrival_epoch_ns) == (TTFT, ARRIVAL)
    assert timing.prefill_span_id == prefill_id and timing.num_prompt_tokens == 12
    placement = place(timing, window_start_ns=ARRIVAL - MS, window_end_ns=ARRIVAL + TTFT + MS,
                      to_perf_ns=lambda ns: ns, max_skew_ns=0)
    assert placement.stages == ("upstream_request", "tokenize", "queue", "prefill",
                                "kv_transfer", "engine_other", "upstream_response")
    assert placement.ends_ns[-2] - placement.ends_ns[0] == TTFT   # the engine's interval
    by_name = {s.name: s for s in spans}
    assert is_request_span(by_name["decode Req e03d5a7c"])
    assert not is_request_span(by_name["prefill Req 6b1f0c2e"])


def test_a_unified_request_is_read_as_before():
    worker = Worker()
    at = lambda ms: ARRIVAL + round(ms * MS)   # noqa: E731
    root_id = worker_spans(
        worker.tracer, TRACEPARENT, role="unified", rid="0123456789abcdef", room=None,
        created_ns=at(0), tokenized_ns=at(1), dispatched_ns=at(1.5), first_token_ns=at(40),
        finished_ns=at(90), scheduler_slices=[
            ("request_process", at(1.6), at(2), None), ("prefill_waiting", at(2), at(12), None),
            ("prefill_forward", at(12), at(39), None)])
    spans = export(worker)
    assert next(s for s in spans if s.span_id == root_id).name == " Req 01234567"
    (_, timing), = engine_timings(spans)
    # queue = the wait, prefill = the attribute (dispatch → first token) minus it.
    assert timing.parts() == (("tokenize", MS), ("queue", 10 * MS), ("prefill", 28_500_000))
    assert (timing.kv_transfer_ns, timing.prefill_span_id) == (None, "")


def test_the_decode_workers_spans_alone_have_no_kv_transfer():
    _, decode, _, decode_id = pd()
    (span, timing), = engine_timings(export(decode))
    assert span.span_id == decode_id
    # Decode mode makes no prefill_waiting: its TTFT is tokenize and engine_other, unsplit.
    assert timing.parts() == (("tokenize", EXPECTED["tokenize"]),)
    assert (timing.ttft_ns, timing.prefill_span_id) == (TTFT, "")


def test_the_prefill_workers_spans_alone_are_no_request():
    prefill, _, _, _ = pd()
    assert engine_timings(export(prefill)) == []


@pytest.mark.parametrize("replace, missing", [
    ({"prefill_transfer_kv_cache": None}, "kv_transfer"),      # missing
    ({"prefill_waiting": (ARRIVAL + 9 * MS, ARRIVAL + 4 * MS)}, "queue"),   # end before start
    ({"prefill_forward": (0, 30 * MS)}, "prefill"),            # no wall-clock start
    ({"prefill_transfer_kv_cache": (ARRIVAL, ARRIVAL + 86_401 * 10**9)}, "kv_transfer"),  # > a day
    ({"prefill_transfer_kv_cache": (ARRIVAL, 2**63 - 1)}, "kv_transfer"),   # fixed64 max
])
def test_a_hostile_prefill_slice_is_unknown_and_the_rest_is_kept(replace, missing):
    prefill, decode, _, _ = pd(replace=replace)
    (_, timing), = engine_timings(export(prefill, decode))
    parts = dict(timing.parts())
    assert missing not in parts
    assert parts == {k: v for k, v in EXPECTED.items() if k != missing}
    placed_sum_intact(timing)


def test_slices_longer_than_the_ttft_are_refused_not_bent():
    hour = 3600 * 10**9
    prefill, decode, _, _ = pd(replace={"prefill_forward": (ARRIVAL, ARRIVAL + hour)})
    (_, timing), = engine_timings(export(prefill, decode))
    assert timing.prefill_ns == hour
    placement = place(timing, window_start_ns=ARRIVAL - MS, window_end_ns=ARRIVAL + TTFT + MS,
                      to_perf_ns=lambda ns: ns, max_skew_ns=0)
    assert (placement.kind, placement.stages) == ("inconsistent", ())


@pytest.mark.parametrize("ttft", [float("nan"), -0.05, 1e12, "0.05", None])
def test_a_hostile_decode_ttft_is_unknown(ttft):
    prefill, decode, _, _ = pd(decode_attrs={"gen_ai.latency.time_to_first_token": ttft})
    found = engine_timings(export(prefill, decode))
    if ttft is None:   # without it the span is no engine's request span
        assert found == []
        return
    (_, timing), = found
    assert timing.ttft_ns is None and timing.kv_transfer_ns == EXPECTED["kv_transfer"]
    placed_sum_intact(timing)


def test_a_prefill_span_of_another_room_or_trace_is_never_paired():
    # Another request's prefill worker in the same trace (another room), and this request's
    # twin in another trace: neither lends its stages.
    prefill, decode, _, _ = pd(prefill_room=0x1234)
    other = pd(traceparent=f"00-{'e' * 32}-{PARENT}-01")
    (_, timing), = engine_timings(export(prefill, decode, other[0]))
    assert timing.kv_transfer_ns is None and timing.prefill_span_id == ""


def test_two_prefill_spans_claiming_one_room_are_both_ignored():
    prefill, decode, _, _ = pd()
    twin, _, _, _ = pd()
    (_, timing), = engine_timings(export(prefill, twin, decode))
    assert (timing.queue_ns, timing.prefill_ns, timing.kv_transfer_ns) == (None, None, None)


def test_pairs_in_one_export_each_get_their_own_prefill_worker():
    first = pd()
    slow = PdTimeline(prefill={**PdTimeline().prefill, "prefill_transfer_kv_cache": (802, 990)})
    second = pd(traceparent=f"00-{'e' * 32}-{PARENT}-01", timeline=slow)
    found = {s.trace_id: t for s, t in engine_timings(
        export(first[0], second[0], second[1], first[1]))}
    assert found[TRACE].kv_transfer_ns == EXPECTED["kv_transfer"]
    assert found["e" * 32].kv_transfer_ns == slow.stage_ns(TTFT)["kv_transfer"]
    assert found["e" * 32].prefill_span_id == second[2]


@pytest.mark.parametrize("kwargs", [
    {"decode_attrs": {"bootstrap_room": room}} for room in (12345, "", "0x" + "f" * 63, True)
] + [{"room": None, "prefill_room": ROOM}])   # the decode's missing
def test_a_decode_span_with_a_hostile_room_is_read_alone(kwargs):
    # SGLang writes `str(hex(room))`; anything else pairs with nothing.
    prefill, decode, _, _ = pd(**kwargs)
    (_, timing), = engine_timings(export(prefill, decode))
    assert timing.parts() == (("tokenize", EXPECTED["tokenize"]),)
    assert timing.prefill_span_id == ""
    placed_sum_intact(timing)
