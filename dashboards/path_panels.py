"""Panels of the whole path as the standalone collector joins it: the waterfall of client TTFT
from the browser's fetch through the backend's critical path and the engine to the first
token, each segment's share over time, and the collector's own health. The TTFT attribution
dashboard places them under its "Whole path (collector)" row.
See docs/architecture.md, "The whole path" and docs/reference.md, "The standalone collector".

The backend segments are whatever `segment` values the collector exports: its closed set
(the `--path-segment` names, at most `--path-top-n` learned ones, `other`), so no query
names a span. The network and engine segments are fixed names, in path order.

>>> path_order(("queue", "prefill"))[:2]
(('network', 'network', '01'), ('network', 'backend_to_engine', '03'))
>>> path_order(("queue", "prefill"))[2:4]
(('engine', 'queue', '04.01'), ('engine', 'prefill', '04.02'))
>>> path_order(ENGINE_SEGMENTS)[-3:]
(('engine', 'engine', '04.17'), ('engine', 'other', '04.18'), ('network', 'first_token', '05'))
"""
from __future__ import annotations

from grafanalib import core as g

from panels import mean, rate, right_axis, sel, targets, timeseries, waterfall
from tracer.sinks.path_metrics import BEACON_RELAY, ENGINE_SEGMENTS, OTHER

PATH_HISTOGRAM = "llm_path_segment_seconds"
# How many backend segments the waterfall draws, largest mean first: the collector's
# default closed set (8 learned names and `other`) and up to 7 `--path-segment` names.
# A larger set leaves its smallest segments out of the drawing (a gap before
# backend_to_engine), never out of the other panels.
BACKEND_SLOTS = 16
# Where each part sits on the path: network, the backend's critical path, the call to the
# engine, the engine's stages, the way back to the browser (docs/architecture.md, "The whole
# path"). The order labels sort the same as text and as numbers.
_NETWORK, _BACKEND_TO_ENGINE, _FIRST_TOKEN = "network", "backend_to_engine", "first_token"


def path_order(engine_stages: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """(part, segment, order) of every fixed segment; the backend's take orders 02.NN.

    `engine_stages` is the pipeline order of the engine's and the proxy's stages (the
    attribution waterfall's); the engine segments follow it, then the opaque `engine` call
    and `other`."""
    engine = [s for s in engine_stages if s in ENGINE_SEGMENTS]
    engine += [s for s in ENGINE_SEGMENTS if s not in engine] + [OTHER]
    return ((("network", _NETWORK, "01"), ("network", _BACKEND_TO_ENGINE, "03"))
            + tuple(("engine", s, f"04.{i + 1:02d}") for i, s in enumerate(engine))
            + (("network", _FIRST_TOKEN, "05"),))


def segment_mean(part: str, segments: tuple[str, ...] = ()) -> str:
    """Mean seconds per observation of each (part, segment) over the dashboard's range;
    a segment no trace had is left out (0/0 is NaN, and NaN >= 0 is false), so it never
    turns a sum into NaN. No `segments`: every segment of `part`."""
    matchers = [f'part="{part}"'] + ([f'segment=~"{"|".join(segments)}"'] if segments else [])
    average = mean(PATH_HISTOGRAM, *matchers, by=("part", "segment"), window="$__range",
                   fn="increase")
    return f"(\n{average}\n) >= 0"


def _backend_top(k: int) -> str:
    return f"topk({k}, {segment_mean('backend')})"


def _total(*means: str) -> str:
    """The sum of `means` (vectors with distinct part/segment labels); 0 when all are empty."""
    if not means:
        return "vector(0)"
    union = "\nor\n".join(means)
    return f"(sum(\n{union}\n) or vector(0))"


def _labelled(expr: str, stage: str, order: str) -> str:
    return (f'label_replace(label_replace({expr}, "stage", "{stage}", "", ""),'
            f' "order", "{order}", "", "")')


def _stage_name(part: str, segment: str) -> str:
    """The waterfall's row: network segments by name, the others prefixed by their part
    (a backend span may be called `queue`, like the engine's stage)."""
    return segment if part == "network" else f"{part}: {segment}"


def _backend_row(k: int, before: str) -> str:
    """The k-th largest backend segment, starting after `before` and the k-1 larger ones."""
    kth = (_backend_top(1) if k == 1
           else f"({_backend_top(k)}\nunless on (segment)\n{_backend_top(k - 1)})")
    start = _total(before, *([_backend_top(k - 1)] if k > 1 else []))
    named = (f'label_replace(sum by (segment) ({kth} * 0)\n+ on () group_left ()\n{start},'
             f' "stage", "backend: $1", "segment", "(.*)")')
    return f'sum by (stage, order) (label_replace({named}, "order", "02.{k:02d}", "", ""))'


def path_offsets(order: tuple[tuple[str, str, str], ...], backend_slots: int = BACKEND_SLOTS) -> str:
    """Where each segment's bar starts: the sum of the means of the segments before it.

    A fixed segment no trace had gets no row; the backend's rows are its `backend_slots`
    largest segments, largest first."""
    network_first = segment_mean("network", (_NETWORK,))
    rows = [_labelled("vector(0)", _NETWORK, "01") + f"\nand on ()\n{network_first}"]
    rows += [_backend_row(k, network_first) for k in range(1, backend_slots + 1)]
    network, engine = [_NETWORK], []
    for part, segment, order_label in order[1:]:
        before = [segment_mean("network", tuple(network)), segment_mean("backend")]
        if engine:
            before.append(segment_mean("engine", tuple(engine)))
        start = _labelled(_total(*before), _stage_name(part, segment), order_label)
        rows.append(f"({start}\nand on ()\n{segment_mean(part, (segment,))})")
        (network if part == "network" else engine).append(segment)
    return "\nor\n".join(rows)


def path_means(backend_slots: int = BACKEND_SLOTS) -> str:
    """Each row's mean, labelled `stage` like its offset."""
    network = f'label_replace({segment_mean("network")}, "stage", "$1", "segment", "(.*)")'
    backend = (f'label_replace({_backend_top(backend_slots)}, "stage", "backend: $1",'
               ' "segment", "(.*)")')
    engine = f'label_replace({segment_mean("engine")}, "stage", "engine: $1", "segment", "(.*)")'
    return f"sum by (stage) (\n{network}\nor\n{backend}\nor\n{engine}\n)"


def path_waterfall_panel(engine_stages: tuple[str, ...]) -> dict:
    return waterfall(
        "Whole path waterfall (collector, mean per trace that had the segment)",
        "Client TTFT as the standalone collector joins it from the browser's beacon, your "
        "backend's spans and the engine's: network (fetch -> your backend), your backend's "
        "critical path by span name (largest first; the collector's closed set, e.g. "
        "'backend: SELECT docs'), backend_to_engine (the call to the engine), the engine's "
        "stages (queue, prefill, engine_other; 'engine: engine' when no engine timing came) "
        "and first_token (back to the browser). Each bar starts where the previous one "
        "ends; with every segment in every trace the last one ends at the mean client TTFT. "
        "A wide backend bar: that span is your bottleneck (a slow query: index it, cache "
        "it; retrieve/rerank: smaller k, a faster model); backend_to_engine or first_token "
        "wide: the network or a buffering gateway between your backend and the engine; "
        "engine bars: read the engine dashboard. Empty: no collector is scraped, or no "
        "trace was joined (see the collector's health).",
        path_offsets(path_order(engine_stages)), path_means())


def _part_sum(part: str, *matchers: str, by: tuple[str, ...] = ()) -> str:
    grouping = f" by ({', '.join(by)})" if by else ""
    is_part = f'part="{part}"'
    return f"sum{grouping} ({rate(f'{PATH_HISTOGRAM}_sum', is_part, *matchers)})"


def path_share_panel() -> g.TimeSeries:
    fixed = lambda segment: _part_sum("network", f'segment="{segment}"')  # noqa: E731
    queries = targets(
        (_NETWORK, fixed(_NETWORK)),
        ("backend: {{segment}}", _part_sum("backend", by=("segment",))),
        (_BACKEND_TO_ENGINE, fixed(_BACKEND_TO_ENGINE)),
        ("engine: {{segment}}", _part_sum("engine", by=("segment",))),
        (_FIRST_TOKEN, fixed(_FIRST_TOKEN)))
    return timeseries(
        "Whole path share of client TTFT over time (collector)",
        "Seconds spent in each segment of the whole path per second, stacked to 100% in "
        "path order: each segment's share of all client TTFT the collector joined (a "
        "trace's segments sum to its client TTFT). A band that widens over time is what "
        "regressed: a backend span (a query, retrieval, moderation), the network on either "
        "side of your backend, or the engine's queue or prefill. The backend bands are the "
        "collector's closed set of span names (configured, the top N learned, other): a "
        "growing 'other' band means a new span worth naming with --path-segment.",
        queries, unit="percentunit", stacking={"mode": "percent", "group": "A"},
        fillOpacity=70, lineWidth=0, legendCalcs=["mean"])


def collector_health_panel() -> g.TimeSeries:
    def by_outcome(counter: str, *matchers: str) -> str:
        return f"sum by (outcome) ({rate(counter, *matchers)})"

    queries = targets(
        ("traces {{outcome}}", by_outcome("llm_collector_traces_total")),
        ("spans {{outcome}}", by_outcome("llm_collector_spans_total",
                                         'outcome=~"forged_parent|late"')),
        ("relay {{outcome}}", by_outcome(f"{BEACON_RELAY}_total", 'outcome=~"failed|dropped"')),
        ("pending traces", f"sum ({sel('llm_collector_pending_traces')})"))
    return timeseries(
        "Collector health",
        "Traces leaving the collector per second by outcome (complete: beacon, backend and "
        "engine timing; partial: no engine timing by the deadline; no_path, no_beacon; "
        "evicted: pushed out by --max-pending-traces), spans refused as late (their trace "
        "had left: raise --join-wait-s) or forged_parent (a parent no service made: someone "
        "writing into others' traces), beacons the relay failed or dropped, and the traces "
        "pending (right axis). Many partial: the engine exports no spans here; evicted or "
        "pending near the bound: more collectors behind the trace-id balancer.",
        queries, unit="ops", overrides=[right_axis("pending traces", "short")])
