"""Building blocks shared by the dashboards: PromQL selectors, targets, panels, layout.

Every selector filters on the dashboard variables `$model` and `$instance`. The model label
is `gen_ai_request_model` on the OTel-semconv histograms and `model` on the llm_* metrics
(docs/reference.md, "Metrics"; tracer/sinks/metrics.py); the stage histogram, the
probe-beacon counter and the per-GPU gauges have none (one process, one set of stages), so
`$instance` alone selects them.

>>> sel("llm_requests_running")
'llm_requests_running{model=~"$model", instance=~"$instance"}'
>>> sel("llm_request_stage_duration_seconds_count", 'stage="queue"')
'llm_request_stage_duration_seconds_count{instance=~"$instance", stage="queue"}'
"""
from __future__ import annotations

from dataclasses import dataclass

import attr
from grafanalib import core as g

DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
# The provisioned data sources (grafana/provisioning/datasources/datasources.yml).
LOKI = {"type": "loki", "uid": "loki"}
TEMPO_UID = "tempo"
STAGE_HISTOGRAM = "llm_request_stage_duration_seconds"
TTFT = "gen_ai_server_time_to_first_token_seconds"
CLIENT_TTFT = "llm_client_time_to_first_token_seconds"
CLIENT_STAGES = "llm_client_stage_duration_seconds"
# Metric-name prefixes without a model label (tracer/sinks/metrics.py, tracer/sinks/gpu.py,
# tracer/sinks/path_metrics.py): per-process series (CPU, event loop, the collector's
# counters) describe the process, whatever it serves.
_WITHOUT_MODEL = (STAGE_HISTOGRAM, "llm_probe_beacons_total", "llm_gpu_", "process_",
                  "llm_event_loop_lag_seconds", "llm_collector_", "llm_beacon_relay_")
# The structlog `request_finished` lines (tracer/sinks/logs.py) of the services Alloy ships
# to Loki (dashboards/alloy/config.alloy labels each stream with its compose service).
REQUEST_LOGS = '{service=~"engine|engine-gpu|proxy"} |= "request_finished"'


def model_label_of(metric: str) -> str | None:
    """The label that names the model on `metric` (a series name, suffix included), if any."""
    if metric.startswith("gen_ai_"):
        return "gen_ai_request_model"
    if metric.startswith(_WITHOUT_MODEL):
        return None
    return "model"


def sel(metric: str, *matchers: str) -> str:
    """A vector selector filtered by the dashboard variables plus `matchers`."""
    model_label = model_label_of(metric)
    model = [f'{model_label}=~"$model"'] if model_label else []
    all_matchers = ", ".join([*model, 'instance=~"$instance"', *matchers])
    return f"{metric}{{{all_matchers}}}"


def rate(metric: str, *matchers: str, window: str = "$__rate_interval",
         fn: str = "rate") -> str:
    return f"{fn}({sel(metric, *matchers)}[{window}])"


def quantile(q: float, histogram: str, *matchers: str, by: tuple[str, ...] = ()) -> str:
    """`q`-quantile of a histogram, aggregated over everything but `by`."""
    by_labels = ", ".join(("le",) + by)
    inner = rate(f"{histogram}_bucket", *matchers)
    return f"histogram_quantile({q}, sum by ({by_labels}) ({inner}))"


def mean(histogram: str, *matchers: str, by: tuple[str, ...] = (),
         window: str = "$__rate_interval", fn: str = "rate") -> str:
    """Mean observation: sum of values / number of observations, over `window`."""
    grouping = f" by ({', '.join(by)})" if by else ""
    sum_s, count = (rate(f"{histogram}_{suffix}", *matchers, window=window, fn=fn)
                    for suffix in ("sum", "count"))
    return f"sum{grouping} ({sum_s})\n  /\nsum{grouping} ({count})"


_LEGACY_TARGET_KEYS = frozenset({"target", "metric", "step", "query"})
# Keys grafanalib writes for interval variables and pre-Grafana-7 tag queries: not in the
# dashboard schema's VariableModel.
_LEGACY_VARIABLE_KEYS = frozenset({"auto", "auto_count", "auto_min", "tagValuesQuery",
                                   "tagsQuery", "useTags"})


@attr.s
class PromTarget(g.Target):
    """A Prometheus query; `exemplar=True` asks Grafana for exemplars (trace ids -> Tempo).

    >>> PromTarget(expr="up", refId="A", exemplar=True).to_json_data()["exemplar"]
    True
    """

    exemplar = attr.ib(default=False, validator=attr.validators.instance_of(bool))
    intervalFactor = attr.ib(default=1)
    datasource = attr.ib(default=attr.Factory(lambda: dict(DATASOURCE)))

    def to_json_data(self) -> dict:
        data = {**super().to_json_data(), "exemplar": self.exemplar}
        # grafanalib also writes Graphite/legacy keys (target, metric, step, query) that the
        # Prometheus query schema does not have (dashboards/schema_check/check.mjs).
        return {k: v for k, v in data.items() if k not in _LEGACY_TARGET_KEYS}


def targets(*queries: tuple[str, str], exemplar: bool = False, instant: bool = False,
            table: bool = False) -> list[PromTarget]:
    """(legend, expr) pairs -> targets with refIds A, B, C, ..."""
    result_format = "table" if table else "time_series"
    return [PromTarget(expr=expr, legendFormat=legend, refId=chr(ord("A") + i),
                       exemplar=exemplar, instant=instant, format=result_format)
            for i, (legend, expr) in enumerate(queries)]


def timeseries(title: str, description: str, queries: list[PromTarget], unit: str,
               **options) -> g.TimeSeries:
    """A time series panel with the house defaults (legend as a table with mean and max)."""
    defaults = dict(legendDisplayMode="table", legendCalcs=["mean", "max"],
                    tooltipMode="multi", maxDataPoints=None, dataSource=DATASOURCE)
    return g.TimeSeries(title=title, description=description, targets=queries, unit=unit,
                        **{**defaults, **options})


def threshold_line(value: float, color: str = "red") -> dict:
    """Options that draw `value` as a dashed line across a time series panel."""
    return dict(thresholds=[{"color": "transparent", "value": None},
                            {"color": color, "value": value}],
                thresholdsStyleMode="dashed")


def right_axis(series_name: str, unit: str) -> dict:
    """Override that moves one series (by display name) to a right-hand axis."""
    return {"matcher": {"id": "byName", "options": series_name},
            "properties": [{"id": "custom.axisPlacement", "value": "right"},
                           {"id": "unit", "value": unit}]}


class VariableTemplate(g.Template):
    """A query variable preset to "All" (regex .*), so every selector matches by default.

    >>> VariableTemplate(name="model", query="label_values(up, job)").to_json_data()["current"]
    {'selected': True, 'text': ['All'], 'value': ['$__all']}
    """

    def to_json_data(self) -> dict:
        data = {k: v for k, v in super().to_json_data().items()
                if k not in _LEGACY_VARIABLE_KEYS}
        data["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        return data


def variables(model_query: str, instance_query: str) -> g.Templating:
    common = dict(dataSource=DATASOURCE, includeAll=True, multi=True, allValue=".*",
                  refresh=g.REFRESH_ON_TIME_RANGE_CHANGE)
    return g.Templating(list=[
        VariableTemplate(name="model", label="model", query=model_query, **common),
        VariableTemplate(name="instance", label="instance", query=instance_query, **common),
    ])


@dataclass(slots=True, frozen=True)
class Cell:
    """One panel and its width in Grafana's 24-column grid.

    >>> Cell(panel={"type": "text"}, width=12).width
    12
    """

    panel: object  # a grafanalib Panel or a raw JSON dict
    width: int


def place(rows: list[tuple[int, list[Cell]]]) -> list:
    """Lay rows of cells out left to right, top to bottom; ids follow reading order (1, 2, ...)."""
    panels, y, next_id = [], 0, 1
    for height, cells in rows:
        if sum(c.width for c in cells) > 24:
            raise ValueError(f"row at y={y} is wider than 24 columns")
        x = 0
        for cell in cells:
            pos = {"h": height, "w": cell.width, "x": x, "y": y}
            if isinstance(cell.panel, dict):
                panels.append({**cell.panel, "gridPos": pos, "id": next_id})
            else:
                panels.append(attr.evolve(cell.panel, gridPos=g.GridPos(**pos), id=next_id))
            x, next_id = x + cell.width, next_id + 1
        y += height
    return panels


def dashboard(uid: str, title: str, description: str, panels: list,
              templating: g.Templating, links: list) -> g.Dashboard:
    # schemaVersion 39 (Grafana 10.4/11): newer than grafanalib's default, so Grafana
    # runs no legacy migrations over the barchart/timeseries JSON.
    return g.Dashboard(uid=uid, title=title, description=description, panels=panels,
                       templating=templating, links=links, tags=["ttftscope"],
                       schemaVersion=39, refresh="10s", time=g.Time("now-30m", "now"),
                       timezone="browser", graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
                       editable=True)


def dashboard_links() -> list:
    return [g.DashboardLink(title="ttftscope", type="dashboards", tags=["ttftscope"],
                            asDropdown=False, includeVars=True, keepTime=True)]


# Dashboard keys grafanalib writes for pre-Grafana-5 dashboards (rows, the old crosshair flag,
# the theme, export inputs): not in the dashboard schema (dashboards/schema_check/check.mjs).
_LEGACY_DASHBOARD_KEYS = frozenset({"__inputs", "hideControls", "rows", "sharedCrosshair",
                                    "style"})
# Panel keys of the same age (row spans, per-panel edit and error flags).
_LEGACY_PANEL_KEYS = frozenset({"editable", "error", "height", "minSpan", "span"})


def grafana_json(board: dict) -> dict:
    """A grafanalib dashboard's JSON as Grafana's schema spells it: legacy keys dropped, and
    the options Grafana's panel schemas require but grafanalib leaves out filled in."""
    board = {k: v for k, v in board.items() if k not in _LEGACY_DASHBOARD_KEYS}
    board["panels"] = [{k: v for k, v in p.items() if k not in _LEGACY_PANEL_KEYS}
                       for p in board.get("panels", [])]
    for panel in board["panels"]:
        legend = panel.get("options", {}).get("legend")
        if legend is not None and "displayMode" in legend:
            legend.setdefault("showLegend", legend.get("displayMode") != "hidden")
    return board


def loki_target(expr: str, ref_id: str = "A", *, instant: bool = False,
                max_lines: int | None = None, legend: str = "") -> dict:
    """A Loki query (LogQL) as Grafana's LokiDataQuery spells it."""
    target = {"datasource": dict(LOKI), "expr": expr, "refId": ref_id, "editorMode": "code",
              "queryType": "instant" if instant else "range", "legendFormat": legend}
    if max_lines is not None:
        target["maxLines"] = max_lines
    return target


def trace_link_override(field: str) -> dict:
    """Turns every value of `field` (a 32-hex trace id) into a link to that trace in Tempo."""
    link = {"title": "Open the trace in Tempo", "url": "",
            "internal": {"datasourceUid": TEMPO_UID, "datasourceName": "Tempo",
                         "query": {"query": "${__value.raw}", "queryType": "traceql"}}}
    return {"matcher": {"id": "byName", "options": field},
            "properties": [{"id": "links", "value": [link]}]}


# The waterfall (docs/architecture.md, "Attribution"): query A is each bar's start, drawn
# but invisible; query B is its mean, the bar you see. Both label their series `stage`;
# A also carries `order`, which sorts the rows (never the name or the value: a 0 s bar would
# tie its neighbour).
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


def waterfall(title: str, description: str, offsets: str, means: str) -> dict:
    """Horizontal stacked bars: an invisible bar to where each `stage` starts (`offsets`,
    labelled `stage` and `order`), then its mean (`means`, labelled `stage`)."""
    queries = targets(("", offsets), ("", means), instant=True, table=True)
    return {
        "type": "barchart", "title": title, "description": description,
        "datasource": DATASOURCE,
        "maxDataPoints": None,
        "targets": [t.to_json_data() for t in queries],
        "transformations": _waterfall_transformations(),
        "fieldConfig": _waterfall_field_config(),
        "options": {
            "orientation": "horizontal", "stacking": "normal", "xField": "stage",
            "showValue": "never", "barWidth": 0.8, "groupWidth": 0.7,
            # Grafana's defaults, spelled out: the bar chart schema requires them.
            "fullHighlight": False, "xTickLabelMaxLength": 0, "xTickLabelRotation": 0,
            "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom",
                       "calcs": []},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
    }


def row_header(title: str) -> dict:
    """A Grafana row: a full-width title over the panels placed below it (height 1)."""
    return {"type": "row", "title": title, "collapsed": False, "panels": []}
