"""Panels over the one log line each request writes (Loki): the slowest requests, each
linked to its trace, and TTFT against TPOT per request. The TTFT attribution dashboard
places them."""
from __future__ import annotations

from panels import LOKI, REQUEST_LOGS, loki_target, trace_link_override

SLOWEST_N = 20
# The newest request lines the TTFT x TPOT scatter plots (Loki returns the newest first).
SCATTER_MAX_LINES = 5000


def _request_fields(*names: str) -> str:
    return ", ".join(f'{n}="{n}"' for n in names)


def slowest_requests_panel() -> dict:
    """The slowest requests of the time range from the request log lines, one row each."""
    fields = ("trace_id", "model", "prompt_tokens", "cached_tokens", "output_tokens",
              "finish_reason")
    expr = (f"topk({SLOWEST_N}, max by ({', '.join(fields)}) (max_over_time(\n"
            f"  {REQUEST_LOGS}\n"
            f"  | json {_request_fields('event', 'ttft_ms', *fields)}\n"
            f'  | event="request_finished" | model=~"$model"\n'
            f'  | unwrap ttft_ms | __error__="" [$__range])))')
    return {
        "type": "table", "title": f"Slowest {SLOWEST_N} requests (server TTFT)",
        "description": (
            "The requests with the longest server TTFT in the time range, from the one log "
            "line every request writes (Loki, so no request is sampled away). Click a "
            "trace_id to open the trace in Tempo (the collector keeps every trace with TTFT "
            "above 2 s, errors, and 10% of the rest). Red cells: TTFT above 2 s. Do: open the "
            "trace and read which llm.<stage> span is long; many cached_tokens = 0 rows point "
            "at cache misses, large prompt_tokens at prefill."),
        "datasource": dict(LOKI), "maxDataPoints": None,
        "targets": [loki_target(expr, instant=True)],
        "transformations": [
            {"id": "labelsToFields", "options": {"mode": "columns"}},
            {"id": "merge", "options": {}},
            {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": "ttft_ms",
                                                                 "desc": True}]}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "indexByName": {"ttft_ms": 0, "trace_id": 1, "model": 2, "prompt_tokens": 3,
                                "cached_tokens": 4, "output_tokens": 5, "finish_reason": 6},
                "renameByName": {"Value": "ttft_ms"}}},
        ],
        "fieldConfig": {
            "defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"},
                                    "inspect": False},
                         "thresholds": {"mode": "absolute", "steps": [
                             {"color": "green", "value": None},
                             {"color": "red", "value": 2000}]}},
            "overrides": [
                trace_link_override("trace_id"),
                {"matcher": {"id": "byName", "options": "Value"},
                 "properties": [{"id": "unit", "value": "ms"},
                                {"id": "custom.cellOptions",
                                 "value": {"type": "color-background", "mode": "basic"}}]}]},
        "options": {"showHeader": True, "cellHeight": "sm", "frameIndex": 0,
                    "footer": {"show": False, "reducer": ["sum"], "countRows": False,
                               "fields": []},
                    "sortBy": [{"displayName": "ttft_ms", "desc": True}]},
    }


def ttft_tpot_scatter_panel() -> dict:
    """TTFT against TPOT, one point per request, coloured by prompt length (Loki lines)."""
    numbers = ("ttft_ms", "tpot_ms", "prompt_tokens")
    expr = (f"{REQUEST_LOGS}\n"
            f"| json {_request_fields('event', 'model', *numbers)}\n"
            f'| event="request_finished" | model=~"$model" | tpot_ms > 0 | __error__=""')
    return {
        "type": "xychart", "title": "TTFT vs TPOT per request, coloured by prompt length",
        "description": (
            "One point per request (the newest "
            f"{SCATTER_MAX_LINES} log lines in the range): time to first token up, time per "
            "output token across, colour = prompt tokens (red = long). Built on the request "
            "log lines in Loki rather than Tempo because every request logs ttft_ms, tpot_ms "
            "and prompt_tokens, while traces are tail-sampled (TPOT is not a span attribute "
            "either). Red points high up: long prompts pay prefill, expected. Points high up "
            "AND to the right: the engine is overloaded (batching slows decode and queues "
            "prefill): add capacity. High TTFT with normal TPOT and short prompts: queueing or "
            "a blocked event loop, not the model."),
        "datasource": dict(LOKI), "maxDataPoints": None,
        "targets": [loki_target(expr, max_lines=SCATTER_MAX_LINES)],
        "transformations": [
            {"id": "extractFields", "options": {"source": "labels", "format": "auto",
                                                "replace": False, "keepTime": False}},
            {"id": "convertFieldType", "options": {"fields": {}, "conversions": [
                {"targetField": name, "destinationType": "number"} for name in numbers]}},
            {"id": "organize", "options": {
                "excludeByName": {}, "indexByName": {n: i for i, n in enumerate(numbers)},
                "renameByName": {}}},
        ],
        "fieldConfig": {
            "defaults": {"color": {"mode": "continuous-GrYlRd"},
                         "custom": {"show": "points", "pointSize": {"fixed": 5},
                                    "hideFrom": {"legend": False, "tooltip": False,
                                                 "viz": False}}},
            "overrides": [
                {"matcher": {"id": "byName", "options": "ttft_ms"},
                 "properties": [{"id": "unit", "value": "ms"},
                                {"id": "custom.axisLabel", "value": "TTFT"}]},
                {"matcher": {"id": "byName", "options": "tpot_ms"},
                 "properties": [{"id": "unit", "value": "ms"},
                                {"id": "custom.axisLabel", "value": "TPOT"}]},
                {"matcher": {"id": "byName", "options": "prompt_tokens"},
                 "properties": [{"id": "unit", "value": "short"}]}]},
        "options": {
            "mapping": "manual",
            "series": [{"frame": {"matcher": {"id": "byIndex", "options": 0}},
                        "x": {"matcher": {"id": "byName", "options": "tpot_ms"}},
                        "y": {"matcher": {"id": "byName", "options": "ttft_ms"}},
                        "color": {"matcher": {"id": "byName", "options": "prompt_tokens"}}}],
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom",
                       "calcs": []},
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }
