"""One request's whole path, from the browser's fetch to its first token (docs/architecture.md,
"The whole path"): the browser's beacon, the backend's own spans and the engine's timing,
joined by trace id into contiguous segments that sum to client TTFT exactly.

    network | <backend critical path, by span name> | backend_to_engine | <engine stages> | first_token

- The backend's root is the SERVER span whose parent is the browser's span (the probe's
  `traceparent`); with no such id in the beacon, the top of the engine span's ancestry.
- The browser is placed on the backend's clock by the midpoint rule the other fronts use
  (tracer/web/probe/alignment.py): [fetch, headers] encloses [root start, response start]
  when the ASGI instrumentation's `http.response.start` send span is there, else [fetch,
  stream end] encloses the root span. When the server's interval is the longer (its end
  stamped late), the starts are aligned instead: the request cannot arrive before it left.
  The result is moved, within that bound, as far as needed to put the browser's first
  token no earlier than the engine's: it cannot be seen before it was made.
- From the root's start to the engine call, the critical path (tracer/record/critical_path.py)
  through every span on the way down to the call, each named after its span.
- The engine: a vLLM, SGLang or TensorRT-LLM request span (tracer/engines/detect.py), placed
  by tracer/engines/placement.py inside [the call's start, the client's first token]; or the
  signed in-band timing of our engine or proxy (tracer/web/inband.py) the beacon carried; or,
  with neither, the call span itself as one opaque `engine` segment. SGLang's prefill/decode
  workers: each engine segment names the worker (and span) it came from.
- `first_token`: the engine's first token to the browser's (back through the backend and the
  network).

Every boundary is clamped between the one before it and the client's first token, so clock
error between hosts can shorten a segment, never make one negative or break the sum.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tracer.collect.trust import CLIENT, PRODUCER, SERVER, TrustedTree
from tracer.engines.detect import engine_timings
from tracer.engines.placement import place
from tracer.engines.spans import SpanView
from tracer.record.critical_path import PathSpan, chain_to, critical_path
from tracer.record.stages import ENGINE_STAGES, SERVER_STAGES
from tracer.record.traceparent import parse_traceparent
from tracer.web.probe.alignment import ClockAlignment
from tracer.web.probe.beacon import Beacon

# The placement's names → the whole path's (part, name).
_PLACED = {"upstream_request": ("network", "backend_to_engine"),
           "upstream_other": ("network", "backend_to_engine"),
           "upstream_response": ("network", "first_token")}
RESPONSE_START = "http.response.start"   # the ASGI instrumentation's send span attribute
MODEL_ATTRIBUTES = ("gen_ai.request.model", "gen_ai.response.model")
# NTP keeps two hosts within a few ms; a sidecar shares its engine's clock.
DEFAULT_MAX_SKEW_S = 0.005
# The fixed segment names, in path order, for /ui's attribution (backend ones are span names).
PATH_STAGES = ("network", "backend_to_engine", "tokenize", "queue", "prefill", "kv_transfer",
               "engine_other", "engine", "first_token")
# Disaggregated (tracer/engines/sglang_pd.py): the prefill worker's stages; the others are the
# decode worker's. Segments name their worker for /ui; metrics keep the one `engine` part.
_PREFILL_WORKER_STAGES = frozenset(("queue", "prefill", "kv_transfer"))
# The closed `engine_source` values of a path: an adapter's, our own servers' in-band, none.
ENGINE_SOURCES = ("vllm", "sglang", "trtllm", "inband", "none")


@dataclass(slots=True, frozen=True)
class PathSegment:
    """One contiguous piece of client TTFT, in Unix ns on the backend's clock."""

    part: str       # network | backend | engine
    name: str       # a backend span's name, or a fixed name (network, queue, first_token, ...)
    start_ns: int
    end_ns: int
    span_id: str = ""
    service: str = ""
    worker: str = ""   # prefill | decode, with prefill/decode disaggregation; else ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True, frozen=True)
class WholePath:
    trace_id: str
    model: str                  # as the engine (or beacon) said; folded to a label later
    root: SpanView
    segments: tuple[PathSegment, ...]
    alignment: ClockAlignment   # browser ms → backend Unix ns
    client_start_ns: int
    client_first_token_ns: int
    engine_source: str          # ENGINE_SOURCES
    placement: str              # tracer/engines/placement.py's kinds, or "inband"/"opaque"
    engine_first_token_ns: int | None

    @property
    def client_ttft_ns(self) -> int:
        return self.client_first_token_ns - self.client_start_ns


def browser_span_id(beacon: Beacon, trace_id: str) -> str | None:
    parent = parse_traceparent(beacon.traceparent) if beacon.traceparent else None
    return parent.span_id if parent is not None and parent.trace_id == trace_id else None


def find_root(tree: TrustedTree, paths: dict, browser_id: str | None,
              engine_ids: list[str]) -> SpanView | None:
    """The backend's root span: the one SERVER span under the browser's, or the one that
    leads to an engine span; None when nothing or more than one candidate qualifies (a
    second root claiming the browser's span is forged, and so may the first be)."""
    if browser_id is not None:
        candidates = [s for s in tree.children.get(browser_id, ()) if s.kind == SERVER]
    else:
        candidates = [s for s in tree.by_id.values()
                      if s.parent_span_id not in tree.by_id and s.kind == SERVER]
    if len(candidates) == 1:
        return candidates[0]
    leading = [r for r in candidates
               if any(chain_to(paths, e, r.span_id) for e in engine_ids)]
    return leading[0] if len(leading) == 1 else None


def assemble(trace_id: str, tree: TrustedTree, beacon: Beacon, server=None, *,
             max_skew_ns: int) -> WholePath | None:
    """The path, or None without a first token, a root, or the browser's milestones."""
    times = beacon.t
    if times.first_token is None:
        return None
    engines = engine_timings(tree.by_id.values())
    paths = _path_map(tree)
    root = find_root(tree, paths, browser_span_id(beacon, trace_id),
                     [s.span_id for s, _ in engines])
    if root is None or root.end_epoch_ns < root.start_epoch_ns:
        return None
    alignment = _align(tree, root, times)
    # Each engine span that leads up to the root, with that chain (root first).
    reached = [(s, t, chain) for s, t in engines
               if (chain := chain_to(paths, s.span_id, root.span_id))]
    if reached:
        alignment = _causal(alignment, times, root, *max(reached, key=_start)[:2])
    client_start = alignment.to_server_ns(times.start)
    client_ft = alignment.to_server_ns(times.first_token)
    children = _children(tree, paths)
    model = beacon.model or ""
    reached = [r for r in reached if r[0].start_epoch_ns <= client_ft]
    cuts = _Boundaries(client_start, client_ft)
    cuts.add("network", "network", root.start_epoch_ns)
    if reached:
        span, timing, chain = max(reached, key=_start)
        model = _model(span) or model
        # The engine span's parent is the backend's call to it, when the backend's HTTP
        # client is instrumented; else the critical path runs to the engine's arrival.
        call = tree.by_id.get(chain[-1].span_id)
        call = call if call is not None and call.kind in (CLIENT, PRODUCER) else None
        _backend(cuts, tree, children, chain if call is None else chain[:-1],
                 call or span)
        placed = place(timing, window_start_ns=cuts.last, window_end_ns=client_ft,
                       to_perf_ns=lambda ns: ns, max_skew_ns=max_skew_ns)
        if placed.stages:
            for stage, end_ns in zip(placed.stages, placed.ends_ns):
                part, name = _PLACED.get(stage, ("engine", stage))
                cuts.add(part, name, end_ns, *(_worker(tree, span, timing, stage)
                                               if part == "engine" else ()))
            return _path(trace_id, model, root, cuts, alignment, client_start, client_ft,
                         timing.source, placed.kind, _engine_end(placed))
        # Not placeable (clock skew, a signal that contradicts itself): the call, or the
        # engine's own span without one, is one opaque segment.
        return _opaque(trace_id, model, root, cuts, alignment, client_start, client_ft,
                       call or span, timing.source, placed.kind)
    call = _latest_call(tree, paths, root, server.recv_unix_ns if server is not None
                        else client_ft)
    if call is not None:
        _backend(cuts, tree, children, chain_to(paths, call.span_id, root.span_id), call)
    else:
        _backend(cuts, tree, children, [_p(root)], None, until_ns=client_ft)
    if server is not None and server.ttft_ms is not None:
        model = model or server.model
        return _inband(trace_id, model, root, cuts, alignment, client_start, client_ft, server)
    return _opaque(trace_id, model, root, cuts, alignment, client_start, client_ft, call,
                   "none", "opaque")


class _Boundaries:
    """Segments as a list of clamped end boundaries, from the client's fetch."""

    def __init__(self, start_ns: int, end_ns: int) -> None:
        self.end_ns = end_ns
        self.last = start_ns
        self.segments: list[PathSegment] = []

    def add(self, part: str, name: str, end_ns: int, span_id: str = "", service: str = "",
            worker: str = "") -> None:
        end = min(max(end_ns, self.last), self.end_ns)
        if end > self.last:
            prev = self.segments[-1] if self.segments else None
            if prev is not None and (prev.part, prev.name, prev.span_id) == (part, name, span_id):
                self.segments[-1] = PathSegment(part, name, prev.start_ns, end, span_id, service,
                                                worker)
            else:
                self.segments.append(PathSegment(part, name, self.last, end, span_id, service,
                                                 worker))
            self.last = end

    def close(self, part: str, name: str) -> tuple[PathSegment, ...]:
        self.add(part, name, self.end_ns)
        return tuple(self.segments)


def _backend(cuts: _Boundaries, tree: TrustedTree, children: dict, chain: list,
             target: SpanView | None, until_ns: int = 0) -> None:
    """The critical path down `chain` (PathSpans, root first) to `target`'s start (or, with
    no target, through the root to `until_ns`): each chain span from its start to the
    next's, its other children the candidates."""
    ends = [(nxt.span_id, nxt.start_ns) for nxt in chain[1:]]
    ends.append(("", until_ns) if target is None else (target.span_id, target.start_epoch_ns))
    for span, (skip, end_ns) in zip(chain, ends):
        for piece in critical_path(span, children, end_ns, skip=skip):
            owner = tree.by_id.get(piece.span.span_id)
            cuts.add("backend", piece.span.name, piece.end_ns, piece.span.span_id,
                     owner.service if owner is not None else "")


def _worker(tree: TrustedTree, span: SpanView, timing, stage: str) -> tuple[str, ...]:
    """(span id, service, worker) of a disaggregated request's engine stage; else ()."""
    if not timing.prefill_span_id:
        return ()
    if stage not in _PREFILL_WORKER_STAGES:
        return span.span_id, span.service, "decode"
    prefill = tree.by_id.get(timing.prefill_span_id)
    return timing.prefill_span_id, prefill.service if prefill is not None else "", "prefill"


def _latest_call(tree: TrustedTree, paths: dict, root: SpanView, before_ns: int) -> SpanView | None:
    """The CLIENT span under the root that started last before `before_ns`: the engine call
    when no engine span names it."""
    best = None
    for span in tree.by_id.values():
        if span.kind == CLIENT and span.start_epoch_ns <= before_ns and (
                best is None or span.start_epoch_ns > best.start_epoch_ns) \
                and chain_to(paths, span.span_id, root.span_id):
            best = span
    return best


def _inband(trace_id, model, root, cuts, alignment, client_start, client_ft, server) -> WholePath:
    ttft_ns = round(server.ttft_ms * 1e6)
    arrival = min(max(server.recv_unix_ns, cuts.last), max(client_ft - ttft_ns, cuts.last))
    cuts.add("network", "backend_to_engine", arrival)
    t = arrival
    # The payload's map has no order of its own: the pipeline's order is the stage contract.
    order = SERVER_STAGES if server.source == "engine" else ENGINE_STAGES
    for stage in order:
        if stage in server.stages_ms:
            t += round(server.stages_ms[stage] * 1e6)
            cuts.add("engine", stage, t)
    cuts.add("engine", "engine_other", arrival + ttft_ns)
    engine_end = cuts.last
    return WholePath(trace_id, model, root, cuts.close("network", "first_token"), alignment,
                     client_start, client_ft, "inband", "inband", engine_end)


def _opaque(trace_id, model, root, cuts, alignment, client_start, client_ft, call, source,
            placement) -> WholePath:
    if call is not None:
        cuts.add("engine", "engine", call.end_epoch_ns)
    return _path(trace_id, model, root, cuts, alignment, client_start, client_ft, source,
                 placement, cuts.last if call is not None else None)


def _path(trace_id, model, root, cuts, alignment, client_start, client_ft, source, placement,
          engine_end) -> WholePath:
    return WholePath(trace_id, model, root, cuts.close("network", "first_token"), alignment,
                     client_start, client_ft, source if source in ENGINE_SOURCES else "none",
                     placement, engine_end)


def _engine_end(placed) -> int | None:
    for stage, end_ns in reversed(list(zip(placed.stages, placed.ends_ns))):
        if stage not in _PLACED:
            return end_ns
    return None


def _align(tree: TrustedTree, root: SpanView, times) -> ClockAlignment | None:
    resp = next((c for c in tree.children.get(root.span_id, ())
                 if c.attributes.get("asgi.event.type") == RESPONSE_START), None)
    if resp is not None and times.headers is not None:
        server = (root.start_epoch_ns, resp.start_epoch_ns)
        client = (times.start, times.headers)
        anchor = "response_start"
    else:
        server = (root.start_epoch_ns, root.end_epoch_ns)
        client = (times.start, times.end)
        anchor = "end"
    c0, c1 = round(client[0] * 1e6), round(client[1] * 1e6)
    offset = ((server[0] + server[1]) - (c0 + c1)) // 2
    network = (c1 - c0) - (server[1] - server[0])
    if network < 0:
        # The server's interval outlasts the browser's: its end was stamped late (a Node
        # server span ends after 'finish', a busy loop later still). The midpoint would put
        # the fetch after the request arrived; the starts are the consistent side, so the
        # browser starts no later than the backend did (a zero-length uplink, the bound).
        offset = server[0] - c0
    return ClockAlignment(offset, abs(network) // 2, anchor)


def _causal(alignment: ClockAlignment, times, root: SpanView, engine: SpanView,
            timing) -> ClockAlignment:
    """The midpoint, moved as causality demands: the browser cannot see the first token
    before the engine made it (its span's arrival plus its own TTFT, on a clock the placement
    trusts within `max_skew`), nor start its fetch after the backend received it. Under load
    the browser's stamps lag, and the midpoint can put its first token before the engine's.
    The midpoint's own bounds (± its uncertainty: each network leg between 0 and the whole
    gap) cut by the causal ones leave an interval of offsets consistent with both; its
    centre is the estimate, as the midpoint is of the unconstrained one, so neither network
    leg is made zero. Bounds that do not meet (stamps lagging past the gap) leave the
    causal bound itself."""
    if timing.ttft_ns is None or not engine.start_epoch_ns:
        return alignment
    lower = engine.start_epoch_ns + timing.ttft_ns - round(times.first_token * 1e6)
    upper = root.start_epoch_ns - round(times.start * 1e6)
    if alignment.offset_ns < lower <= upper:
        high = min(alignment.offset_ns + alignment.uncertainty_ns, upper)
        return replace(alignment, offset_ns=(lower + high) // 2 if high > lower else lower)
    return alignment


def _start(pair) -> int:
    return pair[0].start_epoch_ns


def _model(span: SpanView) -> str:
    for key in MODEL_ATTRIBUTES:
        value = span.attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _p(span: SpanView) -> PathSpan:
    return PathSpan(span.span_id, span.parent_span_id, span.name, span.start_epoch_ns,
                    span.end_epoch_ns)


def _path_map(tree: TrustedTree) -> dict[str, PathSpan]:
    return {k: _p(s) for k, s in tree.by_id.items()}


def _children(tree: TrustedTree, paths: dict[str, PathSpan]) -> dict[str, list[PathSpan]]:
    """`tree.children` as the walk's PathSpans (the ones `paths` already made)."""
    return {k: [paths[s.span_id] for s in v if s.span_id in paths]
            for k, v in tree.children.items()}
