"""The whole path of a request SGLang served disaggregated (docs/architecture.md, "The whole
path"): the engine's segments name the worker, and the span, each came from; the segments
still sum to client TTFT. A unit test of `assemble` on the tree `trusted_tree` keeps: SGLang's
request spans are INTERNAL spans of another service under the backend's CLIENT span, an
edge the trust rule admits (tracer/collect/trust.py)."""
from __future__ import annotations

import json

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.collect.trust import trusted_tree
from tracer.collect.whole_path import assemble
from tracer.engines.spans import request_from_json, request_from_protobuf, spans_of
from tracer.testing.sglang_spans import PdTimeline, pd_request
from tracer.web.probe.schema import parse_beacon
from whole_path_support import MS, backend_trace, beacon, export, now_base_ns

T1 = "4bf92f3577b34da6a3ce929d0e0e4736"
CALL = "7" * 16   # the backend's CLIENT span to the engine, 41 → 290 ms
TTFT = 50 * MS


def _sglang(base_ns: int, *, with_prefill: bool = True):
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sglang"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("sglang server")
    ids = pd_request(tracer, tracer, f"00-{T1}-{CALL}-01", arrival_ns=base_ns + 43 * MS,
                     ttft_ns=TTFT, end_ns=base_ns + 280 * MS)
    spans = memory.get_finished_spans()
    if not with_prefill:
        prefill = {s.context.span_id for s in spans if s.name.startswith("prefill Req")}
        spans = [s for s in spans if s.context.span_id not in prefill
                 and (s.parent is None or s.parent.span_id not in prefill)
                 and not s.name.startswith(("Prefill ", "prefill_"))]
    views = spans_of(request_from_protobuf(encode_spans(spans).SerializeToString()))
    return list(views), ids


def _path(with_prefill: bool = True):
    base = now_base_ns()
    backend = list(spans_of(request_from_json(export(backend_trace(T1, base)[:-1]))))
    engine, ids = _sglang(base, with_prefill=with_prefill)
    tree = trusted_tree(backend + engine)
    assert tree.forged == 0 and len(tree.by_id) == len(backend) + len(engine)
    path = assemble(T1, tree, parse_beacon(json.dumps(beacon(T1)).encode()),
                    max_skew_ns=5 * MS)
    assert path is not None and path.engine_source == "sglang"
    assert sum(s.duration_ns for s in path.segments) == path.client_ttft_ns
    assert all(a.end_ns == b.start_ns for a, b in zip(path.segments, path.segments[1:]))
    return path, ids


def test_the_prefill_and_decode_workers_are_separate_segments():
    path, (prefill_id, decode_id) = _path()
    engine = [(s.name, s.worker, s.span_id, s.duration_ns)
              for s in path.segments if s.part == "engine"]
    expected = PdTimeline().stage_ns(TTFT)
    assert engine == [
        ("tokenize", "decode", decode_id, expected["tokenize"]),
        ("queue", "prefill", prefill_id, expected["queue"]),
        ("prefill", "prefill", prefill_id, expected["prefill"]),
        ("kv_transfer", "prefill", prefill_id, expected["kv_transfer"]),
        ("engine_other", "decode", decode_id, TTFT - sum(expected.values()))]
    assert {s.service for s in path.segments if s.worker} == {"sglang"}
    assert path.placement == "wall_clock"


def test_without_the_prefill_workers_spans_the_engine_is_one_worker_as_before():
    path, _ = _path(with_prefill=False)
    engine = [(s.name, s.worker, s.span_id) for s in path.segments if s.part == "engine"]
    assert engine == [("tokenize", "", ""), ("engine_other", "", "")]
