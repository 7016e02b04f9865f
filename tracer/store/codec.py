"""A `RequestRecord` as the store keeps it: a JSON document on the wall clock, and back.

Records are built on each process's `perf_counter_ns` axis (tracer/record/clock.py), which
means nothing in another process or after a restart. A stored document carries every time
as unix ns instead (`Clock.to_epoch_ns`), and decoding puts it on the reading process's
own axis, so every view (/ui, neighbours, the timeline) reads a record from another replica
or an earlier run exactly as one of its own.

What is never stored: the prompt (`prompt_source`, dropped by the diagnosis anyway), the
engine's raw block source and the span handle. The JSON is UTF-8 with NUL and quotes
escaped (orjson's); a document holding a string that was invalid UTF-8 (a lone surrogate)
is written by `json`, ASCII-only, where it travels as an escape: a column type never meets
a byte it refuses (tracer/sinks/json_text.py). A NaN or infinite number is stored as null.
"""
from __future__ import annotations

import base64
import dataclasses
import json

from tracer.record.clock import Clock
from tracer.record.emits import GapSummary
from tracer.record.request_record import RequestRecord, StageSpan, ToolCall
from tracer.record.rule_outcome import Finding, Unjudged
from tracer.record.verdict import Verdict
from tracer.sinks.json_text import json_writer

# Bumped when a document's shape changes in a way an older reader would misread.
DOC_VERSION = 1
# A document past this is stored with its long strings cut (and says so): a record is a few
# kB, so only a hostile or broken attribute gets here, and it must not cost others the store.
MAX_DOC_BYTES = 256 * 1024
CUT_STRING_CHARS = 1024
TRUNCATED_ATTR = "ttftscope.store.truncated"
# `json.dumps(doc, separators=(",", ":"), default=str)`'s values, written by orjson where it
# can (tracer/sinks/json_text.py: ~7 µs a document where json took ~38).
_dumps = json_writer(separators=(",", ":"), default=str)


def encode(record: RequestRecord, clock: Clock) -> str:
    """The record as one ASCII JSON document, its times in unix ns.

    >>> clock = Clock(wall_ns=1_000_000_000_000, perf_ns=0)
    >>> r = RequestRecord("r", "1" * 32, "2" * 16, "m", "chat", 5, 9, ttft_ns=3)
    >>> back = decode(encode(r, clock), Clock(wall_ns=1_000_000_000_000, perf_ns=100))
    >>> back.start_ns, back.end_ns, back.ttft_ns
    (105, 109, 3)
    """
    doc = _document(record, clock.to_epoch_ns(0))
    text = _dumps(doc)
    if len(text) > MAX_DOC_BYTES:
        doc = _cut(doc)
        doc["attrs"][TRUNCATED_ATTR] = True
        text = _dumps(doc)
    return text


def decode(text: str | bytes, clock: Clock) -> RequestRecord:
    """A stored document as a record on `clock`'s perf axis."""
    doc = json.loads(text)
    shift = -clock.to_epoch_ns(0)
    client = doc.get("client")
    if client is not None and client.get("stages"):
        client = dict(client, stages=[dict(s, start_ns=s["start_ns"] + shift,
                                           end_ns=s["end_ns"] + shift)
                                      for s in client["stages"]])
    record = RequestRecord(
        doc["request_id"], doc["trace_id"], doc["span_id"], doc["model"], doc["operation"],
        doc["start_unix_ns"] + shift, doc["end_unix_ns"] + shift,
        stages=tuple(StageSpan(s, start + shift, end + shift, attrs)
                     for s, start, end, attrs in doc["stages"]),
        unattributed_ns=doc["unattributed_ns"], ttft_ns=doc["ttft_ns"],
        first_output_ns=doc["first_output_ns"], first_output_kind=doc["first_output_kind"],
        tool_calls=tuple(ToolCall(*call) for call in doc["tool_calls"]),
        num_tool_calls=doc["num_tool_calls"],
        itl=GapSummary(**{k: tuple(v) if isinstance(v, list) else v
                          for k, v in doc["itl"].items()}),
        num_prompt_tokens=doc["num_prompt_tokens"], num_cached_tokens=doc["num_cached_tokens"],
        num_output_tokens=doc["num_output_tokens"], num_draft_tokens=doc["num_draft_tokens"],
        num_draft_accepted=doc["num_draft_accepted"], finish_reason=doc["finish_reason"],
        error_type=doc["error_type"], source=doc["source"],
        events=tuple((name, t + shift, _shifted_attrs(attrs, shift))
                     for name, t, attrs in doc["events"]),
        attrs=doc["attrs"], client=client, verdict=_verdict_of(doc.get("verdict")),
        arrival_unix_ms=doc["arrival_unix_ms"],
        block_chain=base64.b64decode(doc["block_chain"]))
    return record


def _document(record: RequestRecord, shift: int) -> dict:
    client = record.client
    if client is not None and client.get("stages"):
        client = dict(client, stages=[dict(s, start_ns=s["start_ns"] + shift,
                                           end_ns=s["end_ns"] + shift)
                                      for s in client["stages"]])
    return {
        "v": DOC_VERSION,
        "request_id": record.request_id, "trace_id": record.trace_id,
        "span_id": record.span_id, "model": record.model, "operation": record.operation,
        "start_unix_ns": record.start_ns + shift, "end_unix_ns": record.end_ns + shift,
        "stages": [[s.stage, s.start_ns + shift, s.end_ns + shift, s.attrs]
                   for s in record.stages],
        "unattributed_ns": record.unattributed_ns, "ttft_ns": record.ttft_ns,
        "first_output_ns": record.first_output_ns,
        "first_output_kind": record.first_output_kind,
        "tool_calls": [[c.name, c.start_ns, c.ready_ns] for c in record.tool_calls],
        "num_tool_calls": record.num_tool_calls,
        "itl": {name: getattr(record.itl, name) for name in _GAP_FIELDS},
        "num_prompt_tokens": record.num_prompt_tokens,
        "num_cached_tokens": record.num_cached_tokens,
        "num_output_tokens": record.num_output_tokens,
        "num_draft_tokens": record.num_draft_tokens,
        "num_draft_accepted": record.num_draft_accepted,
        "finish_reason": record.finish_reason, "error_type": record.error_type,
        "source": record.source,
        "events": [[name, t + shift, _shifted_attrs(attrs, shift)]
                   for name, t, attrs in record.events],
        "attrs": dict(record.attrs), "client": client,
        "verdict": _verdict_doc(record.verdict),
        "arrival_unix_ms": record.arrival_unix_ms,
        "block_chain": base64.b64encode(record.block_chain).decode("ascii"),
    }


# Field names read once: `dataclasses.asdict` and `fields` per record were a third of the
# store writer's encoding (deep copies of what json.dumps only reads). Same JSON text.
_GAP_FIELDS = tuple(f.name for f in dataclasses.fields(GapSummary))
_VERDICT_FIELDS = tuple(f.name for f in dataclasses.fields(Verdict))
_FINDING_FIELDS = tuple(f.name for f in dataclasses.fields(Finding))
_UNJUDGED_FIELDS = tuple(f.name for f in dataclasses.fields(Unjudged))
_PLAIN = frozenset((str, int, float, bool, type(None)))


def _shifted_attrs(attrs: dict, shift: int) -> dict:
    """An event's attributes with its own time (`start_ns`: a prefill chunk's start) on the
    same axis as the event."""
    start = attrs.get("start_ns")
    return attrs if not isinstance(start, int) else dict(attrs, start_ns=start + shift)


def _verdict_doc(verdict: object) -> dict | None:
    if not isinstance(verdict, Verdict):
        return None
    if not (_plain(verdict.evidence) and all(_plain(f.evidence) for f in verdict.findings)):
        # An evidence value json cannot write as it stands: asdict's deep conversion.
        doc = {f.name: getattr(verdict, f.name) for f in dataclasses.fields(verdict)}
        doc["findings"] = [dataclasses.asdict(f) for f in verdict.findings]
        doc["cold"] = [dataclasses.asdict(u) for u in verdict.cold]
        return doc
    doc = {name: getattr(verdict, name) for name in _VERDICT_FIELDS}
    doc["findings"] = [{name: getattr(f, name) for name in _FINDING_FIELDS}
                       for f in verdict.findings]
    doc["cold"] = [{name: getattr(u, name) for name in _UNJUDGED_FIELDS} for u in verdict.cold]
    return doc


def _plain(evidence: dict) -> bool:
    """Whether every value is a scalar json writes as is (then asdict's copy changes nothing)."""
    return all(type(v) in _PLAIN for v in evidence.values())


def _verdict_of(doc: dict | None) -> Verdict | None:
    if doc is None:
        return None
    known = {f.name for f in dataclasses.fields(Verdict)}
    fields = {k: v for k, v in doc.items() if k in known}
    finding_fields = {f.name for f in dataclasses.fields(Finding)}
    fields["findings"] = tuple(Finding(**{k: v for k, v in f.items() if k in finding_fields})
                               for f in doc.get("findings", ()))
    fields["cold"] = tuple(u for u in map(_unjudged, doc.get("cold") or ()) if u is not None)
    return Verdict(**fields)


def _unjudged(doc: object) -> Unjudged | None:
    """One rule that had too little history; None for an entry this version cannot read
    (not an object, or past today's `MIN_SAMPLES`): the verdict is kept without it."""
    try:
        return Unjudged(doc["cause"], doc["samples"])
    except Exception:
        return None


def _cut(value: object) -> object:
    """`value` with every string longer than CUT_STRING_CHARS cut to it."""
    if isinstance(value, str):
        return value if len(value) <= CUT_STRING_CHARS else value[:CUT_STRING_CHARS]
    if isinstance(value, dict):
        return {_cut(k): _cut(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cut(v) for v in value]
    return value
