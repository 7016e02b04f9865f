"""The TTFT attribution dashboard: how long until the first token, and where the time went.

>>> d = ttft_attribution_dashboard(("receive", "send"), ttft_threshold_s=2.0)
>>> d.uid, d.panels[0].title
('ttft-attribution', 'Time to first token')
"""
from __future__ import annotations

from grafanalib import core as g

from panels import (
    DATASOURCE, STAGE_HISTOGRAM, Cell, dashboard, dashboard_links,
    mean, place, quantile, rate, targets, threshold_line, timeseries, variables,
)

UID = "ttft-attribution"
TTFT = "gen_ai_server_time_to_first_token_seconds"
CLIENT_TTFT = "llm_client_time_to_first_token_seconds"


def ttft_panel(ttft_threshold_s: float) -> g.TimeSeries:
    queries = targets(*[(f"server p{q}", quantile(q / 100, TTFT)) for q in (50, 95, 99)],
                      ("client p95 (probe)", quantile(0.95, CLIENT_TTFT)), exemplar=True)
    return timeseries(
        "Time to first token",
        "Server TTFT (request received -> first SSE event with content sent) p50/p95/p99, and "
        "the p95 the browser saw (probe beacons). The dashed line is the LLMTTFTP95High "
        f"threshold ({ttft_threshold_s:g}s). Dots are exemplars: click one to open that "
        "request's trace in Tempo. When p95 is high, read the waterfall below to see which "
        "stage grew; when only the client line is high, see network overhead.",
        queries, unit="s", **threshold_line(ttft_threshold_s))


def stage_mean_over_range(stages: tuple[str, ...]) -> str:
    """Mean seconds per request for each of `stages` over the dashboard's time range."""
    return mean(STAGE_HISTOGRAM, f'stage=~"{"|".join(stages)}"', by=("stage",),
                window="$__range", fn="increase")


# Where the proxy's own stages sit among the engine's (tracer.stages.PROXY_STAGES): the
# proxy sees the upstream connection right after `receive`, and the upstream's answer
# (headers, first content) where the engine's internal stages end, just before `send`.
# The engine's stages keep their pipeline numbers 01..09; the proxy's slot in between, so
# one order serves both, and the numbers sort the same as text and as numbers.
PROXY_STAGE_ORDER = {"upstream_connect": "01.5", "upstream_ttfb": "08.3",
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


# The offset series (query A) is drawn but invisible; the mean (query B) is the bar you see.
_OFFSET_FIELD, _MEAN_FIELD = "starts at", "mean"


def _waterfall_transformations() -> list[dict]:
    return [
        {"id": "joinByField", "options": {"byField": "stage", "mode": "outer"}},
        {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": "order", "desc": False}]}},
        {"id": "organize", "options": {
            "excludeByName": {"Time": True, "Time 1": True, "Time 2": True, "order": True},
            "indexByName": {"stage": 0, "Value #A": 1, "Value #B": 2},
            "renameByName": {"Value #A": _OFFSET_FIELD, "Value #B": _MEAN_FIELD}}},
    ]


def _waterfall_field_config() -> dict:
    invisible = [
        {"id": "color", "value": {"mode": "fixed", "fixedColor": "transparent"}},
        {"id": "custom.fillOpacity", "value": 0},
        {"id": "custom.hideFrom", "value": {"legend": True, "tooltip": False, "viz": False}},
    ]
    return {
        "defaults": {"unit": "s", "color": {"mode": "fixed", "fixedColor": "orange"},
                     "custom": {"fillOpacity": 85, "lineWidth": 0}},
        "overrides": [{"matcher": {"id": "byName", "options": _OFFSET_FIELD},
                       "properties": invisible}],
    }


def waterfall_panel(ordered: tuple[tuple[str, str], ...]) -> dict:
    """Horizontal stacked bars: an invisible offset bar, then the stage's mean duration."""
    stages = tuple(stage for stage, _ in ordered)
    queries = targets(("", waterfall_offsets(ordered)), ("", stage_mean_over_range(stages)),
                      instant=True, table=True)
    return {
        "type": "barchart",
        "title": "Attribution waterfall (mean per request over the time range)",
        "description": (
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
            "Hover a bar for its start and mean."),
        "datasource": DATASOURCE,
        "maxDataPoints": None,
        "targets": [t.to_json_data() for t in queries],
        "transformations": _waterfall_transformations(),
        "fieldConfig": _waterfall_field_config(),
        "options": {
            "orientation": "horizontal", "stacking": "normal", "xField": "stage",
            "showValue": "never", "barWidth": 0.8, "groupWidth": 0.7,
            "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom",
                       "calcs": []},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
    }


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


def network_panel() -> g.TimeSeries:
    overhead, render = "llm_client_network_overhead_seconds", "llm_client_render_delay_seconds"
    return timeseries(
        "Network and gateway overhead (client - server TTFT)",
        "Browser TTFT minus server TTFT per request (probe beacons, clock skew removed): "
        "DNS, TLS, proxies, load balancers and buffering between the user and the server; "
        "render delay is first token -> painted. High while server TTFT is fine: check SSE "
        "buffering in the gateway (e.g. nginx proxy_buffering off), TLS and the CDN.",
        targets(("overhead p50", quantile(0.5, overhead)),
                ("overhead p95", quantile(0.95, overhead)),
                ("render delay p95", quantile(0.95, render)), exemplar=True),
        unit="s")


def beacons_panel() -> g.TimeSeries:
    return timeseries(
        "Probe beacons by outcome",
        "Client-side reports received per second. Rejected or unmatched beacons mean the "
        "client numbers above cover fewer requests: rejected_schema/rejected_size point at "
        "a probe version mismatch, rate_limited at a noisy client, unmatched at traces the "
        "server no longer holds.",
        targets(("{{outcome}}", "sum by (outcome) "
                 f"({rate('llm_probe_beacons_total')})")),
        unit="reqps", stacking={"mode": "normal", "group": "A"}, fillOpacity=40)


def ttft_attribution_dashboard(stages: tuple[str, ...], ttft_threshold_s: float,
                               proxy_stages: tuple[str, ...] = ()) -> g.Dashboard:
    ordered = stage_order(stages, proxy_stages)
    rows = [
        (9, [Cell(ttft_panel(ttft_threshold_s), 24)]),
        (10, [Cell(waterfall_panel(ordered), 13),
              Cell(stage_share_panel(tuple(stage for stage, _ in ordered)), 11)]),
        (8, [Cell(stage_p95_panel(), 12), Cell(unattributed_panel(), 12)]),
        (8, [Cell(network_panel(), 12), Cell(beacons_panel(), 12)]),
    ]
    ttft_count = f"{TTFT}_count"
    return dashboard(
        UID, "TTFT attribution",
        "Where did the time before the first token go? Server and client TTFT, and the "
        "nine server stages (docs/architecture.md, 'The nine server stages') that add up to "
        "the server TTFT; for a ttftscope "
        "proxy in front of a foreign engine (its own instance), the five stages it sees.",
        place(rows),
        # The instance list depends on the chosen model, never on itself.
        variables(f"label_values({ttft_count}, gen_ai_request_model)",
                  f'label_values({ttft_count}{{gen_ai_request_model=~"$model"}}, instance)'),
        dashboard_links())
