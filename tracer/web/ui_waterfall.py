"""A record as the page shows it: its row of the live table (`summary_of`) and its waterfall
(`waterfall_of`: stages, events, the client's stages, the verdict).

All times are ms from the request's receive start (the server axis); client stages, already
placed on that axis at join time (tracer.web.probe.alignment), are shifted the same way, so
the page draws one time axis without any clock math of its own. Apart from the routes
(tracer/web/ui_api.py) because this is the shape of the page's data, a function of the
record alone, whichever route answers it.
"""
from __future__ import annotations

import math

from tracer.engines.placement import REJECTION_DETAIL_ATTR
from tracer.record.clock import Clock
from tracer.record.output_segments import output_fields
from tracer.record.request_record import RequestRecord

_SCALARS = (str, int, float, bool)


def summary_of(record: RequestRecord, clock: Clock) -> dict:
    """One row of the live table."""
    client = record.client or {}
    return {
        "trace_id": record.trace_id, "request_id": record.request_id, "model": record.model,
        "operation": record.operation, "num_prompt_tokens": record.num_prompt_tokens,
        "num_cached_tokens": record.num_cached_tokens,
        "num_output_tokens": record.num_output_tokens,
        "server_ttft_ms": _ms(record.ttft_ns), "client_ttft_ms": client.get("client_ttft_ms"),
        "first_output_kind": record.first_output_kind,
        "e2e_ms": _ms(record.e2e_ns), "finish_reason": record.finish_reason,
        "time_unix_ms": clock.to_epoch_ns(record.start_ns) // 1_000_000,
        "cause": None if record.verdict is None else record.verdict.cause,
    }


def waterfall_of(record: RequestRecord, clock: Clock) -> dict:
    """The record on one axis: ms from receive start, server stages, events, client stages."""
    origin_ns = record.start_ns
    view = summary_of(record, clock)
    view.update(
        error_type=record.error_type, source=record.source,
        unattributed_ms=record.unattributed_ns / 1e6, **output_fields(record),
        stages=[{"stage": s.stage, "start_ms": (s.start_ns - origin_ns) / 1e6,
                 "end_ms": (s.end_ns - origin_ns) / 1e6, "duration_ms": s.duration_ns / 1e6,
                 "attrs": _json_safe(s.attrs)} for s in record.stages],
        events=[{"name": name, "t_ms": (t_ns - origin_ns) / 1e6, "attrs": _json_safe(attrs)}
                for name, t_ns, attrs in record.events],
        client=None if record.client is None else _client_of(record, record.client),
        # An engine timing that could not fit the upstream window, in words: not placed.
        engine_timing_rejected=record.attrs.get(REJECTION_DETAIL_ATTR),
        verdict=None if record.verdict is None else {
            **record.verdict.fields(), "sentence": record.verdict.sentence()})
    return view


def _client_of(record: RequestRecord, client: dict) -> dict:
    origin_ns = record.start_ns
    stages = [{"stage": s["stage"], "start_ms": (s["start_ns"] - origin_ns) / 1e6,
               "end_ms": (s["end_ns"] - origin_ns) / 1e6,
               "duration_ms": (s["end_ns"] - s["start_ns"]) / 1e6}
              for s in client.get("stages", ())]
    out = {key: client.get(key) for key in (
        "outcome", "status", "client_ttft_ms", "network_overhead_ms", "render_delay_ms",
        "clock", "chunks", "itl_ms", "resource", "probe_errors", "sdk", "buffering",
        "first_output_ms", "first_output_kind", "first_tool_call_ms", "tool_calls")}
    out["stages"] = stages
    out["gap"] = _network_gap(record, stages)
    return out


def _network_gap(record: RequestRecord, client_stages: list[dict]) -> dict | None:
    """The network + gateway time around the server's TTFT, on the shared axis: uplink (fetch
    called → receive start) and downlink (first token sent → first token parsed); their sum
    is exactly client TTFT − server TTFT."""
    by_name = {s["stage"]: s for s in client_stages}
    first_token = by_name.get("client.first_token")
    if not client_stages or first_token is None or record.ttft_ns is None:
        return None
    uplink_ms = -client_stages[0]["start_ms"]
    downlink_ms = first_token["end_ms"] - record.ttft_ns / 1e6
    return {"uplink_ms": uplink_ms, "downlink_ms": downlink_ms,
            "total_ms": uplink_ms + downlink_ms}


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def _json_safe(attrs: dict | None) -> dict:
    # Stage attrs come from the engine, but anything not a JSON scalar is stringified, and a
    # non-finite float (a FLOP/s of a zero-length span) is not JSON at all.
    return {str(k): _json_value(v) for k, v in (attrs or {}).items()}


def _json_value(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, _SCALARS) else str(value)
