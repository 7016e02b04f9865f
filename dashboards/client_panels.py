"""Panels of the browser's view (probe beacons): client vs server TTFT with the client phases
stacked, network + gateway overhead, held-back streams, and the beacons themselves. The TTFT
attribution dashboard places them."""
from __future__ import annotations

from grafanalib import core as g

from panels import (CLIENT_STAGES, CLIENT_TTFT, TTFT, mean, quantile, rate, right_axis, targets,
                    threshold_line, timeseries)


def _client_stage_sum(stages: str) -> str:
    matcher = f'stage=~"{stages}"'
    return f"sum ({rate(f'{CLIENT_STAGES}_sum', matcher)})"


def client_phases_panel() -> g.TimeSeries:
    """Mean per request of each phase from Enter to the first painted character, stacked."""
    # Every beacon with a response has a `request` stage: the per-beacon denominator.
    has_request = 'stage="request"'
    beacons = f"sum ({rate(f'{CLIENT_STAGES}_count', has_request)})"
    connect = f"{_client_stage_sum('dns|tcp|tls')}\n  /\n{beacons}"
    overhead = "llm_client_network_overhead_seconds"
    phases = targets(
        ("input -> fetch", mean(CLIENT_STAGES, 'stage="input"')),
        ("DNS + TCP + TLS", connect),
        ("server TTFT", mean(TTFT)),
        ("network + gateway", f"clamp_min(\n{mean(overhead)}\n  -\n({connect}),\n0)"),
        ("render", mean("llm_client_render_delay_seconds")),
        ("client TTFT (fetch -> first token)", mean(CLIENT_TTFT)),
    )
    line = {"matcher": {"id": "byName", "options": "client TTFT (fetch -> first token)"},
            "properties": [{"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                           {"id": "custom.fillOpacity", "value": 0},
                           {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [8, 4]}},
                           {"id": "color", "value": {"mode": "fixed", "fixedColor": "white"}}]}
    return timeseries(
        "Client vs server TTFT: where the user's wait goes",
        "Mean per request, stacked from the user's Enter to the first painted character: "
        "input -> fetch (page work before the request), DNS + TCP + TLS (connection setup), "
        "server TTFT, network + gateway (client TTFT - server TTFT - connection setup: "
        "proxies, load balancers, SSE buffering), render (first token -> painted). The dashed "
        "line is the browser's TTFT from fetch. Red (one band dominates): input -> the page "
        "blocks before fetch; DNS/TCP/TLS -> no keep-alive or a far region; network + "
        "gateway -> turn off proxy buffering (nginx proxy_buffering off), check the CDN; "
        "render -> the page's main thread is busy; server -> read the waterfall.",
        phases, unit="s", stacking={"mode": "normal", "group": "A"}, fillOpacity=60,
        lineWidth=1, overrides=[line])


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


def buffering_panel(buffered_share: float) -> g.TimeSeries:
    held_back = "llm_client_stream_held_back_seconds"
    share = (f"sum ({rate('llm_client_stream_buffered_total')})\n  /\n"
             f"sum ({rate(held_back + '_count')})")
    return timeseries(
        "Streams held back by an intermediary",
        "Of the streams the probe could judge (3+ content events), the share whose first "
        "events reached the browser in one burst though the server sent them spread out "
        "(in-band send times vs the probe's arrival times, tracer/web/probe/buffering.py), "
        "and the p95 of the send spread the browser did not see (right axis). Red: above "
        "the dashed line, LLMStreamBuffered fires: a proxy, CDN or compression middleware "
        "buffers text/event-stream; set nginx proxy_buffering off (or honour "
        "X-Accel-Buffering: no) and do not compress event streams.",
        targets(("buffered share", share),
                ("held back p95", quantile(0.95, held_back)), exemplar=True),
        unit="percentunit", valueMin=0, overrides=[right_axis("held back p95", "s")],
        **threshold_line(buffered_share))


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
