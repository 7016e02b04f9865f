"""A window of requests and engine steps as Chrome Trace Event JSON (Perfetto, chrome://tracing).

The input is what `GET /ui/api/timeline` answers (docs/reference.md, "Timeline and
neighbours"): times in ms from the window's start. The output is the format's object form,
`{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`, with the fields the
Trace Event Format defines
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU) as
Perfetto reads them (https://perfetto.dev/docs/getting-started/other-formats, "Chrome JSON
format"): complete slices `ph: "X"` with `ts` and `dur` in µs, counters `ph: "C"` (one series
per numeric arg), metadata `ph: "M"` (`process_name`, `process_sort_index`, `thread_name`,
`thread_sort_index`).

The tracks:
- process "engine" (pid 1), thread "engine steps": one slice per step named by its kind, its
  token counts and requests in args; the counter "tokens per step" (prefill tokens, decode
  sequences), back to 0 when the engine idles. Absent when the server keeps no step log.
- process "requests" (pid 2): one thread per request in start order, named
  `req <trace id prefix>… (<prompt tokens> tok)`, a slice `request` over its interval and its
  phases (preprocess, queue, prefill, first_token, decode) as slices nested inside it.

Perfetto requires the slices of one thread to nest, never to overlap partly
(https://perfetto.dev/docs/faq), so phases are clipped to their request and to each other, and
a step to the previous step's end. Tids are unique across both processes and never equal a
pid, like an OS's thread ids, so no importer can merge two tracks. `ts` 0 is the
window's start, or the earliest start in it when something began before the window (no `ts`
is negative); `otherData.origin_unix_ms` says which. No flow arrows: a window holds thousands
of decode steps, each with its batch; a step's args name its requests instead.

Hostile values: a slice with a missing, non-finite or absurd time is dropped (counted in
`otherData.num_dropped`), a negative duration becomes 0, text is copied only when it is a
string (and cut to 256 characters), counts only when they are non-negative integers.
"""
from __future__ import annotations

import math

ENGINE_PID, REQUESTS_PID = 1, 2
ENGINE_TID, FIRST_REQUEST_TID = 3, 4
COUNTER_NAME = "tokens per step"
MAX_TEXT = 256
MAX_STEP_REQUESTS = 64       # a step's args name this many of its batch, then count the rest
# Beyond ±30 years a time is nonsense; inside, every ns offset fits an int64 (Perfetto's ts).
_MAX_ABS_MS = 1e12


def chrome_trace(timeline: dict) -> dict:
    """The timeline JSON as Chrome Trace Event JSON (object form); never raises on bad input.

    >>> out = chrome_trace({"from_unix_ms": 1000, "to_unix_ms": 2000, "steps": [],
    ...     "step_log_size": None, "requests": [{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    ...     "request_id": "r1", "start_ms": 0, "end_ms": 20, "num_prompt_tokens": 714,
    ...     "phases": [{"phase": "queue", "start_ms": 0, "end_ms": 12.5},
    ...                {"phase": "prefill", "start_ms": 12.5, "end_ms": 20}]}]})
    >>> [(e["ph"], e["name"], e.get("ts"), e.get("dur")) for e in out["traceEvents"]][-3:]
    [('X', 'request', 0, 20000), ('X', 'queue', 0, 12500), ('X', 'prefill', 12500, 7500)]
    >>> out["traceEvents"][2]["args"]["name"]
    'req 4bf92f35… (714 tok)'
    """
    timeline = timeline if isinstance(timeline, dict) else {}
    requests = [r for r in _list(timeline.get("requests")) if isinstance(r, dict)]
    steps = [s for s in _list(timeline.get("steps")) if isinstance(s, dict)]
    kept_requests = [(r, span) for r in requests if (span := _request_span(r)) is not None]
    kept_requests.sort(key=lambda item: item[1][0])            # stable: start order
    kept_steps = _step_spans(steps)
    starts = [span[0] for _, span in kept_requests] + [s for s, _, _ in kept_steps]
    origin = min([0.0, *starts])

    events: list[dict] = []
    with_engine = timeline.get("step_log_size") is not None or bool(kept_steps)
    if with_engine:
        events += _process(ENGINE_PID, "engine", 0)
        events += _thread(ENGINE_PID, ENGINE_TID, "engine steps", 0)
    events += _process(REQUESTS_PID, "requests", 1)
    for index, (request, _) in enumerate(kept_requests):
        events += _thread(REQUESTS_PID, FIRST_REQUEST_TID + index, _track_name(request), index)
    if with_engine:
        events += _step_events(kept_steps, origin)
    for index, (request, span) in enumerate(kept_requests):
        events += _request_events(request, span, FIRST_REQUEST_TID + index, origin)

    num_slices = len(requests) + len(steps) + sum(
        len(_list(r.get("phases"))) for r in requests)
    num_kept = sum(1 for e in events if e["ph"] == "X")
    from_ms = _unix_ms(timeline.get("from_unix_ms"))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "ttftscope /ui/api/timeline",
            "from_unix_ms": from_ms,
            "to_unix_ms": _unix_ms(timeline.get("to_unix_ms")),
            "origin_unix_ms": None if from_ms is None else _unix_ms(from_ms + origin),
            "num_requests": len(kept_requests),
            "num_more_requests": _count(timeline.get("num_more_requests")),
            "num_steps": len(kept_steps),
            "num_more_steps": _count(timeline.get("num_more_steps")),
            "num_dropped": max(0, num_slices - num_kept),
        },
    }


def _request_span(request: dict):
    """(start, end, [(phase, start, end)]) in window ms, the phases clipped to nest; None
    when the request's own times are unusable (its whole track is dropped)."""
    start = _time(request.get("start_ms"))
    if start is None:
        return None
    phases = []
    for phase in _list(request.get("phases")):
        if not isinstance(phase, dict):
            continue
        name = _text(phase.get("phase"))
        p_start, p_end = _time(phase.get("start_ms")), _time(phase.get("end_ms"))
        if name is not None and p_start is not None and p_end is not None:
            phases.append((name, p_start, max(p_end, p_start)))
    phases.sort(key=lambda p: p[1])
    raw_end = request.get("end_ms")
    if raw_end is None:           # in flight without an end: as far as its phases go
        end = max([start, *(p[2] for p in phases)])
    elif (end := _time(raw_end)) is None:
        return None
    end = max(end, start)
    clipped, cursor = [], start
    for name, p_start, p_end in phases:
        p_start = min(max(p_start, cursor), end)
        p_end = min(max(p_end, p_start), end)
        clipped.append((name, p_start, p_end))
        cursor = p_end
    return start, end, clipped


def _step_spans(steps: list[dict]) -> list[tuple[float, float, dict]]:
    spans = []
    for step in steps:
        start, end = _time(step.get("start_ms")), _time(step.get("end_ms"))
        if start is not None and end is not None:
            spans.append((start, max(end, start), step))
    spans.sort(key=lambda s: s[0])
    out, cursor = [], -math.inf
    for start, end, step in spans:
        start = max(start, cursor)
        end = max(end, start)
        out.append((start, end, step))
        cursor = end
    return out


def _step_events(spans, origin: float) -> list[dict]:
    events = []
    for i, (start, end, step) in enumerate(spans):
        prefill = _count(step.get("num_prefill_tokens"))
        decode = _count(step.get("num_decode_seqs"))
        batch = [r for r in _list(step.get("requests")) if isinstance(r, dict)]
        args = {"num_prefill_tokens": prefill, "num_decode_seqs": decode,
                "num_preempted": _count(step.get("num_preempted")),
                "requests": [_step_request(r) for r in batch[:MAX_STEP_REQUESTS]]}
        if len(batch) > MAX_STEP_REQUESTS:
            args["num_more_requests"] = len(batch) - MAX_STEP_REQUESTS
        events.append(_slice(_text(step.get("kind")) or "step", "step", ENGINE_PID, ENGINE_TID,
                             start, end, origin, args))
        events.append(_counter(start, origin, prefill or 0, decode or 0))
        following = spans[i + 1][0] if i + 1 < len(spans) else None
        if following is None or following > end:    # the engine idles until the next step
            events.append(_counter(end, origin, 0, 0))
    return events


def _step_request(entry: dict) -> dict:
    return {"request_id": _text(entry.get("request_id")), "trace_id": _text(entry.get("trace_id")),
            "num_tokens": _count(entry.get("num_tokens")), "phase": _text(entry.get("phase"))}


def _request_events(request: dict, span, tid: int, origin: float) -> list[dict]:
    start, end, phases = span
    common = {"trace_id": _text(request.get("trace_id")),
              "request_id": _text(request.get("request_id")),
              "tokens": _count(request.get("num_prompt_tokens")),
              "cause": _text(request.get("cause"))}
    whole = {**common, "model": _text(request.get("model")),
             "num_cached_tokens": _count(request.get("num_cached_tokens")),
             "ttft_ms": _time(request.get("ttft_ms")),
             "in_flight": request.get("in_flight") is True}
    events = [_slice("request", "request", REQUESTS_PID, tid, start, end, origin, whole)]
    for name, p_start, p_end in phases:
        events.append(_slice(name, "phase", REQUESTS_PID, tid, p_start, p_end, origin,
                             {**common, "phase_ms": p_end - p_start}))
    return events


def _slice(name: str, cat: str, pid: int, tid: int, start: float, end: float, origin: float,
           args: dict) -> dict:
    # Both ends in integer ns first: a child clipped inside its parent stays inside after
    # rounding, which rounding ts and dur apart would not promise.
    start_ns, end_ns = _ns(start - origin), _ns(end - origin)
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
            "ts": _us(start_ns), "dur": _us(max(0, end_ns - start_ns)), "args": args}


def _counter(at: float, origin: float, prefill: int, decode: int) -> dict:
    return {"name": COUNTER_NAME, "ph": "C", "pid": ENGINE_PID, "tid": ENGINE_TID,
            "ts": _us(_ns(at - origin)), "args": {"prefill_tokens": prefill, "decode_seqs": decode}}


def _process(pid: int, name: str, sort_index: int) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
             "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
             "args": {"sort_index": sort_index}}]


def _thread(pid: int, tid: int, name: str, sort_index: int) -> list[dict]:
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
             "args": {"name": name}},
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
             "args": {"sort_index": sort_index}}]


def _track_name(request: dict) -> str:
    ident = _text(request.get("trace_id")) or _text(request.get("request_id")) or "?"
    name = f"req {ident[:8]}…" if len(ident) > 8 else f"req {ident}"
    tokens = _count(request.get("num_prompt_tokens"))
    return name if tokens is None else f"{name} ({tokens} tok)"


def _ns(ms: float) -> int:
    return round(ms * 1e6)


def _us(ns: int) -> int | float:
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _time(value) -> float | None:
    """A time or duration in ms: a finite number within ±_MAX_ABS_MS, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) <= _MAX_ABS_MS else None


def _unix_ms(value) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value < 2**53:
        return None
    return int(value) if value == int(value) else float(value)


def _count(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0 or value != int(value) or value > 2**53:
        return None
    return int(value)


def _text(value) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _list(value) -> list:
    return value if isinstance(value, list) else []
