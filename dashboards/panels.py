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
STAGE_HISTOGRAM = "llm_request_stage_duration_seconds"
# Metric-name prefixes without a model label (tracer/sinks/metrics.py, tracer/sinks/gpu.py).
_WITHOUT_MODEL = (STAGE_HISTOGRAM, "llm_probe_beacons_total", "llm_gpu_")


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
        return {**super().to_json_data(), "exemplar": self.exemplar}


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
        data = super().to_json_data()
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
