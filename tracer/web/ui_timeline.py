"""`/ui/api/timeline` and `/ui/api/trace/<id>`'s neighbours: a window of requests and engine
steps on one axis (docs/reference.md, "Timeline and neighbours").

Times are ms from the window's start (`from_unix_ms`); a window is one request's server
interval widened by `pad_ms`, or any [from, to] of at most an hour. The answer is bounded
(tracer/record/window_limits.py): the newest requests and steps kept, the rest counted.
"""
from __future__ import annotations

from tracer.core.neighbourhood import Neighbourhood
from tracer.record.clock import Clock
from tracer.record.neighbours import MAX_NEIGHBOURS
from tracer.record.occupancy import Occupancy
from tracer.record.request_record import RequestRecord
from tracer.record.window_limits import (
    DEFAULT_PAD_MS,
    MAX_PAD_MS,
    MAX_WINDOW_MS,
    MAX_WINDOW_STEPS,
)
from tracer.record.traceparent import is_trace_id
from tracer.web.openai_http import OpenAIError, bounded_int
from tracer.web.probe.endpoint import TRACE_ID_PATTERN

_MS = 1_000_000

# The query parameters as /openapi.json lists them (the route reads strings and checks them).
TIMELINE_QUERY = {"parameters": [
    {"name": "trace_id", "in": "query", "required": False,
     "schema": {"type": "string", "pattern": TRACE_ID_PATTERN}},
    {"name": "pad_ms", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_PAD_MS, "default": DEFAULT_PAD_MS}},
    {"name": "from_unix_ms", "in": "query", "required": False, "schema": {"type": "integer"}},
    {"name": "to_unix_ms", "in": "query", "required": False, "schema": {"type": "integer"}}]}


def unix_ms_param(text: str, param: str) -> int:
    """A wall-clock time in unix ms (digits only, at most 15), else a 400.

    >>> unix_ms_param("1764000000000", "from_unix_ms")
    1764000000000
    """
    if not (0 < len(text) <= 15 and text.isascii() and text.isdigit()):
        raise OpenAIError(400, f"{param} must be a time in unix milliseconds, got {text[:20]!r}",
                          param=param, code="invalid_value")
    return int(text)


def window_of_query(store, clock: Clock, neighbourhood: Neighbourhood | None, trace_id: str,
                    pad_ms: str, from_unix_ms: str, to_unix_ms: str) -> tuple[int, int]:
    """(from_ns, to_ns) of a timeline query's parameters; an `OpenAIError` (400, 404) when
    they name no window this server can answer."""
    if neighbourhood is None:
        raise OpenAIError(404, "this server keeps no timeline", code="not_found")
    if trace_id:
        pad = 0 if pad_ms == "0" else bounded_int(pad_ms, "pad_ms", 1, MAX_PAD_MS)
        record = store.get(trace_id) if is_trace_id(trace_id) else None
        if record is None:
            raise OpenAIError(404, "no request with this trace id in the trace store",
                              param="trace_id", code="trace_not_found")
        return window_of_record(record, pad)
    return window_of_times(clock, unix_ms_param(from_unix_ms, "from_unix_ms"),
                           unix_ms_param(to_unix_ms, "to_unix_ms"))


def window_of_record(record: RequestRecord, pad_ms: int) -> tuple[int, int]:
    """The record's server interval widened by `pad_ms` each side, perf_counter ns."""
    return record.start_ns - pad_ms * _MS, record.end_ns + pad_ms * _MS


def window_of_times(clock: Clock, from_unix_ms: int, to_unix_ms: int) -> tuple[int, int]:
    if to_unix_ms <= from_unix_ms or to_unix_ms - from_unix_ms > MAX_WINDOW_MS:
        raise OpenAIError(400, "to_unix_ms must be after from_unix_ms, by at most "
                          f"{MAX_WINDOW_MS} ms", param="to_unix_ms", code="invalid_value")
    return clock.to_perf_ns(from_unix_ms * _MS), clock.to_perf_ns(to_unix_ms * _MS)


def timeline_of(neighbourhood: Neighbourhood, clock: Clock, from_ns: int, to_ns: int) -> dict:
    """The window's requests and steps, in the contract's JSON shape."""
    origin = from_ns
    rows, num_more = neighbourhood.occupancies(from_ns, to_ns)
    steps = neighbourhood.steps(from_ns, to_ns)
    steps = [] if steps is None else steps
    num_more_steps = max(len(steps) - MAX_WINDOW_STEPS, 0)
    steps = steps[num_more_steps:]
    trace_of = {o.request_id: o.trace_id for o in rows}
    return {
        "from_unix_ms": clock.to_epoch_ns(from_ns) / _MS,
        "to_unix_ms": clock.to_epoch_ns(to_ns) / _MS,
        "num_requests": len(rows), "num_more_requests": num_more,
        "num_steps": len(steps), "num_more_steps": num_more_steps,
        "step_log_size": neighbourhood.step_log_size,
        "requests": [_request_row(o, origin) for o in rows],
        "steps": [_step_row(s, origin, trace_of) for s in steps]}


def neighbours_view(neighbourhood: Neighbourhood, record: RequestRecord) -> dict:
    """`neighbours` of `/ui/api/trace/<id>`: over the record's time to first token."""
    found = neighbourhood.neighbours_of(record)
    return {"window": "ttft" if record.ttft_ns is not None else "request",
            "items": [n.fields() for n in found[:MAX_NEIGHBOURS]],
            "num_more": max(len(found) - MAX_NEIGHBOURS, 0)}


def _ms(ns: int, origin: int) -> float:
    return (ns - origin) / _MS


def _request_row(o: Occupancy, origin: int) -> dict:
    return {"trace_id": o.trace_id, "request_id": o.request_id, "model": o.model,
            "start_ms": _ms(o.start_ns, origin), "end_ms": _ms(o.end_ns, origin),
            "ttft_ms": None if o.ttft_end_ns is None else (o.ttft_end_ns - o.start_ns) / _MS,
            "num_prompt_tokens": o.num_prompt_tokens, "num_cached_tokens": o.num_cached_tokens,
            "cause": o.cause, "in_flight": o.in_flight,
            "phases": [{"phase": p, "start_ms": _ms(a, origin), "end_ms": _ms(b, origin)}
                       for p, a, b in o.phases]}


def _step_row(step, origin: int, trace_of: dict[str, str]) -> dict:
    n_decode = step.num_decode_seqs
    return {"start_ms": _ms(step.start_ns, origin), "end_ms": _ms(step.end_ns, origin),
            "kind": step.kind, "num_prefill_tokens": step.num_prefill_tokens,
            "num_decode_seqs": n_decode, "num_preempted": step.num_preempted,
            "requests": [{"request_id": rid, "trace_id": trace_of.get(rid), "num_tokens": n,
                          "phase": "decode" if i < n_decode else "prefill"}
                         for i, (rid, n) in enumerate(zip(step.request_ids, step.num_tokens))]}

