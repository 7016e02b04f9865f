"""The TTFT attribution dashboard: how long until the first token, and where the time went.

>>> d = ttft_attribution_dashboard(("receive", "send"), ttft_threshold_s=2.0)
>>> d.uid, d.panels[0].title
('ttft-attribution', 'Time to first token')
"""
from __future__ import annotations

from grafanalib import core as g

from cause_panels import cause_excess_panel, cause_share_panel
from client_panels import beacons_panel, buffering_panel, client_phases_panel, network_panel
from panels import (
    CLIENT_TTFT, DATASOURCE, STAGE_HISTOGRAM, TTFT, Cell, dashboard, dashboard_links,
    mean, place, quantile, rate, row_header, targets, threshold_line,
    timeseries, variables, waterfall,
)
from path_panels import collector_health_panel, path_share_panel, path_waterfall_panel
from request_log_panels import slowest_requests_panel, ttft_tpot_scatter_panel

UID = "ttft-attribution"
# Share of requests over 1 s / 2 s that the SLO panel draws red (a dashboard target, not an
# alert: the alerts are in dashboards/thresholds.py).
SLOW_SHARE_TARGET = 0.05


def ttft_panel(ttft_threshold_s: float) -> g.TimeSeries:
    server = [(f"server p{label}", quantile(q, TTFT))
              for label, q in (("50", 0.5), ("95", 0.95), ("99", 0.99), ("99.9", 0.999))]
    queries = targets(*server, ("client p95 (probe)", quantile(0.95, CLIENT_TTFT)),
                      exemplar=True)
    return timeseries(
        "Time to first token",
        "Server TTFT (request received -> first SSE event with content sent) p50/p95/p99/p99.9, "
        "and the p95 the browser saw (probe beacons). Red: a line above the dashed "
        f"LLMTTFTP95High threshold ({ttft_threshold_s:g}s). Dots are exemplars: click one to "
        "open that request's trace in Tempo. When p95 is high, read the waterfall below to see "
        "which stage grew; p99.9 alone high is a few stragglers (see the slowest requests); "
        "when only the client line is high, see network overhead.",
        queries, unit="s", **threshold_line(ttft_threshold_s))


def ttft_heatmap_panel() -> dict:
    """Requests per TTFT bucket over time: a bimodal band is cache hits vs misses."""
    counts = f"sum by (le) ({rate(f'{TTFT}_bucket', fn='increase')})"
    target = targets(("{{le}}", counts), exemplar=True)[0].to_json_data()
    return {
        "type": "heatmap", "title": "TTFT distribution over time",
        "description": (
            "How many requests took how long to their first token, per time slice (server "
            "TTFT buckets). Two bands are normal with prefix caching: hits low, misses high; "
            "see TTFT by cache outcome. Red (dark cells) high up: many requests are slow, not "
            "just a tail; a band moving up over time is a regression (read the waterfall); a "
            "new upper band means a new population (longer prompts, a cold cache, a saturated "
            "queue). Exemplar dots open one request's trace."),
        "datasource": DATASOURCE, "maxDataPoints": 120,
        "targets": [{**target, "format": "heatmap"}],
        "fieldConfig": {"defaults": {"custom": {
            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
            "scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False, "cellGap": 1, "showValue": "never",
            "color": {"mode": "scheme", "scheme": "Reds", "fill": "dark-red",
                      "scale": "exponential", "exponent": 0.5, "steps": 64, "reverse": False},
            "exemplars": {"color": "rgba(80,160,255,0.9)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "yAxis": {"axisPlacement": "left", "unit": "s", "reverse": False},
        },
    }


def slow_share_panel() -> g.TimeSeries:
    ratio = "llm:ttft_over_{}s:ratio_rate5m"
    matchers = ('model=~"$model"', 'instance=~"$instance"')
    queries = targets(*[(f"over {s} s {{{{instance}}}} {{{{model}}}}",
                         f"{ratio.format(s)}{{{', '.join(matchers)}}}") for s in (1, 2)])
    return timeseries(
        "Share of requests with TTFT over 1 s and 2 s",
        "The fraction of requests (5-minute window, recording rules "
        "llm:ttft_over_1s/2s:ratio_rate5m) whose server TTFT exceeded 1 s and 2 s; both are "
        "TTFT bucket bounds, so the share is counted, not interpolated. Red: above the "
        f"dashed {SLOW_SHARE_TARGET:.0%} line, more users than the target wait that long: "
        "check whether the heatmap shows a whole band moving up (capacity: queue, prefill) or "
        "a tail (the slowest requests, their traces).",
        queries, unit="percentunit", valueMin=0, **threshold_line(SLOW_SHARE_TARGET))


def ttft_split_panel(label: str, title: str, description: str) -> g.TimeSeries:
    histogram = f"llm_ttft_by_{label}_seconds"
    queries = targets(*[(f"p{q} {{{{{label}}}}}", quantile(q / 100, histogram, by=(label,)))
                        for q in (50, 95)])
    return timeseries(title, description, queries, unit="s")


def cache_split_panel() -> g.TimeSeries:
    return ttft_split_panel(
        "cache", "TTFT by prefix-cache outcome",
        "Server TTFT p50/p95 for requests whose prompt was a prefix-cache hit (almost all "
        "tokens cached), partial, or miss. Misses should be slower by the prefill of the "
        "uncached part. Red (hits as slow as misses): prefill is not the bottleneck, look at "
        "queue and CPU; misses much slower than usual: long uncached prompts, consider a "
        "shared system prompt or larger KV cache (see the engine dashboard's hit ratio).")


def prompt_len_split_panel() -> g.TimeSeries:
    return ttft_split_panel(
        "prompt_len", "TTFT by prompt length",
        "Server TTFT p50/p95 per prompt-length bucket (tokens: <256, <1k, <4k, <16k, >=16k). "
        "TTFT growing with length is prefill cost and expected. Red (short prompts slow too): "
        "the time is not prefill; look at queue and event-loop lag. Only long prompts slow: "
        "enable chunked prefill or cap prompt length.")


def stage_mean_over_range(stages: tuple[str, ...]) -> str:
    """Mean seconds per request for each of `stages` over the dashboard's time range."""
    return mean(STAGE_HISTOGRAM, f'stage=~"{"|".join(stages)}"', by=("stage",),
                window="$__range", fn="increase")


# Where the proxy's own stages sit among the engine's (tracer.stages.PROXY_STAGES): the
# proxy sees the upstream connection right after `receive`, and the upstream's answer
# (headers, first content) where the engine's internal stages end, just before `send`.
# The engine's stages keep their pipeline numbers 01..09; the proxy's slot in between, so
# one order serves both, and the numbers sort the same as text and as numbers.
# A proxy record joined with its engine's own timing (tracer.record.stages.ENGINE_STAGES)
# carries the engine's `tokenize`, `queue` and `prefill` under their own numbers, and the
# remainders around them: before the engine's arrival (01.6, or 01.7 with no arrival
# stamp), Ollama's model_load between queue and prefill (05.5), after its prefill (06.2 the
# KV transfer of prefill/decode disaggregation, 06.3 TGI's inference, 06.6 what the
# engine's TTFT does not split) and from its first token to ours (08.4). Joined and
# unjoined proxy records both show up when a range holds both: each bar is the mean over
# the requests that had it.
PROXY_STAGE_ORDER = {"upstream_connect": "01.5", "upstream_request": "01.6",
                     "upstream_other": "01.7", "model_load": "05.5", "kv_transfer": "06.2",
                     "inference": "06.3", "engine_other": "06.6",
                     "upstream_ttfb": "08.3", "upstream_response": "08.4",
                     "upstream_first_token": "08.6"}


def stage_order(stages: tuple[str, ...],
                proxy_stages: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """(stage, order label) of the engine's `stages` and the proxy's extra ones, in order.

    >>> stage_order(("receive", "queue", "send"), ("receive", "upstream_connect", "send"))
    (('receive', '01'), ('upstream_connect', '01.5'), ('queue', '02'), ('send', '03'))
    """
    orders = {stage: f"{i + 1:02d}" for i, stage in enumerate(stages)}
    extra = [s for s in proxy_stages if s not in orders]
    orders.update({s: PROXY_STAGE_ORDER[s] for s in extra})
    return tuple(sorted(orders.items(), key=lambda item: float(item[1])))


def _has_data(stage: str) -> str:
    """Selects the stage's row only when the selected instances recorded that stage."""
    count = rate(f"{STAGE_HISTOGRAM}_count", f'stage="{stage}"', window="$__range",
                 fn="increase")
    return f"sum by (stage) ({count}) > 0"


def waterfall_offsets(ordered: tuple[tuple[str, str], ...]) -> str:
    """Where each stage's bar starts: the sum of the means of the stages before it.

    Each series is labelled with its stage and its pipeline `order`, so the panel sorts by
    order and never by name or value (a 0 s stage would tie its neighbour). A stage the
    selected instances never recorded (the engine's inside a proxy, or the other way
    round) gets no row and adds nothing to the offsets after it.
    """
    stages = tuple(stage for stage, _ in ordered)
    parts = []
    for i, (stage, order) in enumerate(ordered):
        start = "vector(0)" if i == 0 else f"sum(\n{stage_mean_over_range(stages[:i])}\n)"
        parts.append(f'(label_replace(label_replace({start}, "stage", "{stage}", "", ""),'
                     f' "order", "{order}", "", "")\nand on (stage)\n{_has_data(stage)})')
    return "\nor\n".join(parts)


def waterfall_panel(ordered: tuple[tuple[str, str], ...]) -> dict:
    """Horizontal stacked bars: an invisible offset bar, then the stage's mean duration."""
    stages = tuple(stage for stage, _ in ordered)
    return waterfall(
        "Attribution waterfall (mean per request over the time range)",
        "The server stages in pipeline order; each bar starts where the previous one "
        "ends, so the last bar ends at the mean server TTFT. The widest bar is where the "
        "time goes. queue wide: the engine is saturated (add capacity, shed load); "
        "prefill wide: long or uncached prompts (prefix caching, chunked prefill); "
        "kv_lookup wide: KV cache exhausted; template/tokenize/detokenize wide: CPU "
        "starved; receive/send wide: blocked event loop or slow client. For the "
        "ttftscope proxy in front of a foreign engine, pick its instance: its five "
        "stages show instead (upstream_connect wide: connection pool or network to the "
        "engine; upstream_ttfb: the engine's queue and prefill before it answers; "
        "upstream_first_token: the engine's time from headers to first content). With "
        "a proxy and an engine both selected, their shared receive and send are pooled. "
        "Hover a bar for its start and mean.",
        waterfall_offsets(ordered), stage_mean_over_range(stages))


def _is_stage(stage: str) -> str:
    return f'stage="{stage}"'


def stage_share_panel(stages: tuple[str, ...]) -> g.TimeSeries:
    queries = targets(*[(stage, f"sum ({rate(f'{STAGE_HISTOGRAM}_sum', _is_stage(stage))})")
                        for stage in stages])
    return timeseries(
        "Stage share of server TTFT over time",
        "Seconds spent in each stage per second, stacked to 100%: the share of all "
        "time-to-first-token spent in that stage. A band that widens over time is the stage "
        "that regressed; compare with the engine dashboard (queue with requests waiting, "
        "prefill with prompt tokens/s and prefix-cache hits). Stage metrics are per "
        "instance: the model variable does not narrow them; select either a proxy or the "
        "engine behind it, not both (their stages cover the same time).",
        queries, unit="percentunit", stacking={"mode": "percent", "group": "A"},
        fillOpacity=70, lineWidth=0, legendCalcs=["mean"])


def stage_p95_panel() -> g.TimeSeries:
    return timeseries(
        "Stage p95 over time",
        "The 95th percentile of each stage on its own. Tail problems hide in means: a stage "
        "whose p95 approaches the TTFT p95 is what LLMTTFTStageDominant alerts on.",
        targets(("{{stage}}", quantile(0.95, STAGE_HISTOGRAM, by=("stage",))), exemplar=True),
        unit="s", scaleDistributionType="log", scaleDistributionLog=10)


def unattributed_panel() -> g.TimeSeries:
    unattributed = _is_stage("unattributed")
    return timeseries(
        "Unattributed time",
        "Time inside server TTFT that no stage boundary covers. The instrumented engine "
        "should read zero: anything else is an instrumentation gap (file a bug). For a "
        "proxied foreign engine it is the part the proxy cannot see inside the upstream.",
        targets(("mean per request", mean(STAGE_HISTOGRAM, unattributed)),
                ("p99", quantile(0.99, STAGE_HISTOGRAM, unattributed))),
        unit="s")


def ttft_attribution_dashboard(stages: tuple[str, ...], ttft_threshold_s: float,
                               proxy_stages: tuple[str, ...] = (),
                               buffered_share: float = 0.1) -> g.Dashboard:
    ordered = stage_order(stages, proxy_stages)
    rows = [
        (9, [Cell(ttft_panel(ttft_threshold_s), 24)]),
        (8, [Cell(cause_excess_panel(), 14), Cell(cause_share_panel(), 10)]),
        (9, [Cell(ttft_heatmap_panel(), 14), Cell(slow_share_panel(), 10)]),
        (8, [Cell(cache_split_panel(), 12), Cell(prompt_len_split_panel(), 12)]),
        (10, [Cell(waterfall_panel(ordered), 13),
              Cell(stage_share_panel(tuple(stage for stage, _ in ordered)), 11)]),
        (8, [Cell(stage_p95_panel(), 12), Cell(unattributed_panel(), 12)]),
        (9, [Cell(client_phases_panel(), 24)]),
        (8, [Cell(network_panel(), 8), Cell(buffering_panel(buffered_share), 8),
             Cell(beacons_panel(), 8)]),
        (10, [Cell(slowest_requests_panel(), 12), Cell(ttft_tpot_scatter_panel(), 12)]),
        (1, [Cell(row_header("Whole path (collector)"), 24)]),
        (10, [Cell(path_waterfall_panel(tuple(stage for stage, _ in ordered)), 10),
              Cell(path_share_panel(), 8), Cell(collector_health_panel(), 6)]),
    ]
    ttft_count = f"{TTFT}_count"
    return dashboard(
        UID, "TTFT attribution",
        "Where did the time before the first token go? Server and client TTFT, and the "
        "nine server stages (docs/architecture.md, 'The nine server stages') that add up to "
        "the server TTFT; for a ttftscope "
        "proxy in front of a foreign engine (its own instance), the five stages it sees, split "
        "into the engine's own queue, prefill and remainders when the engine reports its "
        "timing (docs/architecture.md, 'Inside the engine').",
        place(rows),
        # The instance list depends on the chosen model, never on itself.
        variables(f"label_values({ttft_count}, gen_ai_request_model)",
                  f'label_values({ttft_count}{{gen_ai_request_model=~"$model"}}, instance)'),
        dashboard_links())
