"""A request's `llm.<stage>` spans written straight to OTLP bytes from its record: the
encoded path of `SpanBuilder` (tracer/sinks/spans.py), taken when ttftscope's OTLP processor
is the only one. The same bytes as encoding each span's `ReadableSpan`
(tests/tracer/test_otlp_export.py compares them).

The common stage span (any but `prefill`, whose attributes and events come from the record,
and one whose own attributes do not name `stage`) is written in one `ChildSpanFrame`: what a
request's children share (trace and parent ids, kind, status, flags) is encoded once a
request, and each stage's name and `llm.stage` attribute once a process.
"""
from __future__ import annotations

from collections.abc import Callable

from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from tracer.record.request_record import RequestRecord
from tracer.sinks.otlp_encoding import (ChildSpanFrame, attribute_fields, encode_span_fields,
                                        encoded_span, kind_field, name_field)
from tracer.sinks.span_attributes import clean_attributes, prefill_attributes

UNSET = Status(StatusCode.UNSET)
INTERNAL = kind_field(SpanKind.INTERNAL)
# stage -> its span's encoded name field and its encoded `llm.stage` attribute
_STAGE_PARTS: dict[str, tuple[bytes, bytes]] = {}


def encode_stage_spans(record: RequestRecord, trace_id: int, parent_span_id: int,
                       prefill_events: list, offset_ns: int, new_span_id: Callable[[], int],
                       resource, scope, append: Callable[[object], None]) -> None:
    """One encoded span per stage of `record`, children of `parent_span_id`, each handed to
    `append`; `offset_ns` turns the record's perf_counter times into epoch ns."""
    frame = ChildSpanFrame(trace_id, parent_span_id, INTERNAL, UNSET)
    parts_of = _STAGE_PARTS
    for stage in record.stages:
        name = stage.stage
        stage_attrs = stage.attrs
        start, end = stage.start_ns + offset_ns, stage.end_ns + offset_ns
        if (name != "prefill" and start > 0 and end > 0
                and not (stage_attrs and ("stage" in stage_attrs
                                          or "llm.stage" in stage_attrs))):
            # The common stage span: its attributes then `llm.stage`, in the frame.
            parts = parts_of.get(name) or _stage_parts(name)
            attributes = (attribute_fields(clean_attributes(stage_attrs, "llm.")) + parts[1]
                          if stage_attrs else parts[1])
            append(encoded_span(resource, scope, frame.encode(
                new_span_id(), parts[0], start, end, attributes)))
            continue
        attrs = clean_attributes(stage_attrs, "llm.")
        attrs["llm.stage"] = name
        events = ()
        if name == "prefill":
            events = prefill_events
            prefill_attributes(attrs, record, events, stage.end_ns - stage.start_ns)
        append(encoded_span(resource, scope, encode_span_fields(
            trace_id, new_span_id(), None, parent_span_id, False, f"llm.{name}", INTERNAL,
            start, end, attrs, 0, events, status=UNSET)))


def _stage_parts(stage: str) -> tuple[bytes, bytes]:
    if len(_STAGE_PARTS) >= 256:   # stage names are a closed set; bounded anyway
        _STAGE_PARTS.clear()
    parts = _STAGE_PARTS[stage] = (name_field(f"llm.{stage}"),
                                   attribute_fields({"llm.stage": stage}))
    return parts
