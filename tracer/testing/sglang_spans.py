"""SGLang's spans for one request, made with the real OpenTelemetry SDK the way SGLang makes
them (the sources tracer/engines/sglang_pd.py cites), for the adapter's and the proxy's tests:

- the request span (`TraceReqContext.trace_req_start`): kind INTERNAL (no kind given), named
  `f"{role} Req {rid[:8]}"` (role "" when unified), parented on the `traceparent` the worker
  received, attributes `rid`, `module` = `sglang::request` and `bootstrap_room` =
  `str(hex(room))` at its start; at the finish the tokenizer manager's
  (`convert_to_span_attrs`: `SpanAttributes`' usage, request id, model and finish reasons,
  and `convert_to_gen_ai_span_attrs`' five latencies, in seconds);
- one thread span per process under it (`__create_thread_context`): named
  `"{thread_label}[ [TP n] ](host:{host_id[:8]} | pid:{pid})"`, attributes `tp_rank`,
  `host_id`, `pid`, `thread_label` (`"Prefill Tokenizer"`, `"Decode Scheduler"`, ...);
- the slices (`trace_slice`, `trace_slice_start`/`_end`): each under its process's thread
  span, or under the slice still open there (`fake_output` under `decode_forward`), linked
  to the slice before it; the tokenizer's `tokenize` and `api_server_dispatch`.

`PdTimeline` lays one disaggregated request out as SGLang's setters stamp it
(`SchedulerReqTimeStats`: prefill `bootstrap queue → wait queue → forward → transfer queue`,
decode `prealloc queue → transfer queue → wait queue → forward`), in fractions of the decode
worker's TTFT.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Link
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
HOST_ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"   # /etc/machine-id's form
ROOM = 0x5D2C_9A41_7E33_0B18
LABELS = {"unified": ("Tokenizer", "Scheduler"),
          "prefill": ("Prefill Tokenizer", "Prefill Scheduler"),
          "decode": ("Decode Tokenizer", "Decode Scheduler")}


def _thread(tracer, root_context, label: str, pid: int, start_ns: int, tp_rank=None):
    name = label + (f" [TP {tp_rank}] " if tp_rank is not None else "")
    name += f"(host:{HOST_ID[:8]} | pid:{pid})"
    attrs = {"tp_rank": tp_rank} if tp_rank is not None else {}
    attrs.update({"host_id": HOST_ID, "pid": pid, "thread_label": label})
    return tracer.start_span(name, context=root_context, start_time=start_ns, attributes=attrs)


def _slices(tracer, thread_span, slices) -> None:
    """(name, start, end, parent name or None) in the order SGLang ends them; each slice a
    span under the thread span (or under the named open slice), linked to the last
    first-level one."""
    made, last = {}, None
    for name, start_ns, end_ns, parent in slices:
        under = made[parent] if parent else thread_span
        links = [Link(last.get_span_context())] if last is not None and not parent else []
        span = tracer.start_span(name, context=trace.set_span_in_context(under),
                                 start_time=start_ns, links=links)
        made[name] = span
        if not parent:
            last = span
    for name, start_ns, end_ns, parent in slices:   # a parent may end after its children
        made[name].end(end_time=end_ns)


def worker_spans(tracer, traceparent: str, *, role: str, rid: str, created_ns: int,
                 tokenized_ns: int, dispatched_ns: int, first_token_ns: int, finished_ns: int,
                 scheduler_slices: list, room: int | None = ROOM, pid: int = 4100,
                 prompt_tokens: int = 12, attrs: dict | None = None) -> str:
    """One SGLang server's spans for one request; the request span's id. `attrs` replace
    the finish attributes (hostile tests: None removes one)."""
    root_attrs = {"rid": rid.split("_")[-1], "module": "sglang::request"}
    if room:
        root_attrs["bootstrap_room"] = str(hex(room))
    prefix = "" if role == "unified" else role
    root = tracer.start_span(f"{prefix} Req {rid.split('_')[-1][:8]}",
                             context=_PROPAGATOR.extract({"traceparent": traceparent}),
                             start_time=created_ns, attributes=root_attrs)
    inside = trace.set_span_in_context(root)
    tokenizer_label, scheduler_label = LABELS[role]
    tokenizer = _thread(tracer, inside, tokenizer_label, pid, created_ns)
    _slices(tracer, tokenizer, [("tokenize", created_ns, tokenized_ns, None),
                                ("api_server_dispatch", tokenized_ns, dispatched_ns, None)])
    tokenizer.end(end_time=dispatched_ns)   # the dispatch's end finishes the thread
    scheduler_start = scheduler_slices[0][1] if scheduler_slices else dispatched_ns
    scheduler = _thread(tracer, inside, scheduler_label, pid + 1, scheduler_start, tp_rank=0)
    _slices(tracer, scheduler, scheduler_slices)
    scheduler.end(end_time=finished_ns)
    s = 1e-9
    finish = {"gen_ai.usage.completion_tokens": 6, "gen_ai.usage.prompt_tokens": prompt_tokens,
              "gen_ai.usage.cached_tokens": 0, "gen_ai.request.id": rid,
              "gen_ai.response.model": "Qwen/Qwen3-8B",
              "gen_ai.response.finish_reasons": json.dumps(["stop"]),
              "gen_ai.latency.time_to_first_token": (first_token_ns - created_ns) * s,
              "gen_ai.latency.e2e": (finished_ns - created_ns) * s,
              "gen_ai.latency.time_in_model_decode": (finished_ns - first_token_ns) * s,
              "gen_ai.latency.time_in_model_inference": (finished_ns - dispatched_ns) * s,
              "gen_ai.latency.time_in_model_prefill": (first_token_ns - dispatched_ns) * s}
    finish.update(attrs or {})
    root.set_attributes({k: v for k, v in finish.items() if v is not None})
    root.end(end_time=finished_ns)
    return format(root.get_span_context().span_id, "016x")


@dataclass(frozen=True)
class PdTimeline:
    """One disaggregated request, as offsets from the decode worker's arrival in
    thousandths of its TTFT (the router sends both workers the request at once)."""

    prefill: dict = field(default_factory=lambda: {
        "created": 4, "tokenized": 24, "dispatched": 28, "first_token": 966, "finished": 968,
        "prefill_prepare": (30, 32), "prefill_bootstrap": (32, 80),
        "prefill_waiting": (80, 200), "prefill_forward": (200, 800),
        "prefill_transfer_kv_cache": (802, 960)})
    decode: dict = field(default_factory=lambda: {
        "created": 0, "tokenized": 20, "dispatched": 24, "first_token": 1000,
        "decode_prepare": (26, 28), "decode_bootstrap": (28, 70),
        "decode_transferred": (70, 970), "decode_waiting": (970, 980),
        "decode_forward": (980, 1300), "fake_output": (980, 986)})

    def stage_ns(self, ttft_ns: int) -> dict[str, int]:
        """What the adapter should read: tokenize, queue, prefill, kv_transfer."""
        d, p = self.decode, self.prefill
        at = lambda k: round(ttft_ns * k / 1000)   # noqa: E731
        return {"tokenize": at(d["tokenized"]) - at(d["created"]),
                **{stage: at(p[name][1]) - at(p[name][0]) for stage, name in (
                    ("queue", "prefill_waiting"), ("prefill", "prefill_forward"),
                    ("kv_transfer", "prefill_transfer_kv_cache"))}}


def pd_request(prefill_tracer, decode_tracer, traceparent: str, *, arrival_ns: int,
               ttft_ns: int, end_ns: int, timeline: PdTimeline = PdTimeline(),
               room: int | None = ROOM, prefill_room: int | None = None,
               replace: dict | None = None, decode_attrs: dict | None = None
               ) -> tuple[str, str]:
    """Both workers' spans (the prefill worker's first: its request ends first); the ids of
    (prefill, decode) request spans. `replace` maps a slice name to (start, end) ns, or to
    None to leave it out (hostile tests); `prefill_room` another room for the prefill's;
    `decode_attrs` replace the decode worker's finish attributes."""
    at = lambda k: arrival_ns + round(ttft_ns * k / 1000)   # noqa: E731
    replace = replace or {}

    def slices(stamps: dict, names: tuple) -> list:
        out = []
        for name in names:
            if name in replace and replace[name] is None:
                continue   # left out
            start, end = replace.get(name) or (at(stamps[name][0]), at(stamps[name][1]))
            out.append((name, start, end, "decode_forward" if name == "fake_output" else None))
        return out

    p, d = timeline.prefill, timeline.decode
    prefill_id = worker_spans(
        prefill_tracer, traceparent, role="prefill", rid="6b1f0c2e9d4a4b7c8e5f3a2d1c0b9a87",
        created_ns=at(p["created"]), tokenized_ns=at(p["tokenized"]),
        dispatched_ns=at(p["dispatched"]), first_token_ns=at(p["first_token"]),
        finished_ns=at(p["finished"]), room=room if prefill_room is None else prefill_room,
        scheduler_slices=slices(p, ("prefill_prepare", "prefill_bootstrap", "prefill_waiting",
                                    "prefill_forward", "prefill_transfer_kv_cache")))
    # The decode worker's `decode_forward` stays open until the answer ends.
    d = {**d, "decode_forward": (d["decode_forward"][0],
                                 (end_ns - arrival_ns) * 1000 / ttft_ns)}
    decode_id = worker_spans(
        decode_tracer, traceparent, role="decode", rid="e03d5a7c21b84f6a9c0d1e2f3a4b5c6d",
        created_ns=at(d["created"]), tokenized_ns=at(d["tokenized"]),
        dispatched_ns=at(d["dispatched"]), first_token_ns=at(d["first_token"]),
        finished_ns=end_ns, room=room, pid=5200, attrs=decode_attrs,
        scheduler_slices=slices(d, ("decode_prepare", "decode_bootstrap", "decode_transferred",
                                    "decode_waiting", "decode_forward", "fake_output")))
    return prefill_id, decode_id
