"""Panels of the TTFT verdicts (tracer/record/causes.py): why TTFT is high, as the seconds
above normal each cause explains and the share of requests it names. They read the
recording rules the alerts read (llm:ttft_excess_seconds:rate5m, llm:ttft_cause:rate5m);
the TTFT attribution dashboard places them."""
from __future__ import annotations

from grafanalib import core as g

from panels import sel, targets, timeseries
from tracer.record.causes import CAUSE_NAMES, NO_CAUSE

EXCESS = "llm:ttft_excess_seconds:rate5m"
VERDICTS = "llm:ttft_cause:rate5m"
# Healthy and unjudged name no cause: left out, so the stack is what is wrong.
_NAMES_A_CAUSE = f'cause!~"{"|".join(NO_CAUSE)}"'
# One colour per cause in both panels, so a band reads the same across them (Grafana's
# palette would colour by series order, which differs between the two queries).
_PALETTE = ("orange", "purple", "red", "yellow", "blue", "dark-green", "dark-red",
            "light-blue", "dark-purple", "dark-yellow")


def _cause_colors() -> list[dict]:
    causes = [c for c in CAUSE_NAMES if c not in NO_CAUSE]
    return [{"matcher": {"id": "byName", "options": cause},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}]}
            for cause, color in zip(causes, _PALETTE * 2)]


def cause_excess_panel() -> g.TimeSeries:
    """TTFT above normal per second, stacked by the cause that explains it."""
    excess = f"sum by (cause) ({sel(EXCESS, _NAMES_A_CAUSE)})"
    return timeseries(
        "Why TTFT is high: time above normal by cause",
        "Seconds of TTFT above what is normal for the model, per second of traffic, stacked "
        "by the cause of each request's verdict (5-minute rates of "
        "llm_ttft_excess_seconds_total; docs/runbook.md has a section per cause). The "
        "widest band is what to fix first, and the one LLMTTFTP95High names: it weighs how "
        "often a cause strikes by how much it costs. Divide by the request rate for seconds "
        "per request. Confirm with /ui/api/diagnosis?minutes=15, which lists each cause's "
        "slowest requests; the sentence above a request's waterfall in /ui gives its "
        "numbers and the change to make.",
        targets(("{{cause}}", excess)), unit="s", stacking={"mode": "normal", "group": "A"},
        fillOpacity=70, lineWidth=0, legendCalcs=["mean", "max"], overrides=_cause_colors())


def cause_share_panel() -> g.TimeSeries:
    """The share of requests each cause names (healthy and unjudged are the rest)."""
    named = f"sum by (cause) ({sel(VERDICTS, _NAMES_A_CAUSE)})"
    share = f"{named}\n  /\nignoring (cause) group_left ()\nsum ({sel(VERDICTS)})"
    return timeseries(
        "Share of requests by cause",
        "The fraction of requests whose TTFT verdict named each cause (5-minute window; "
        "the rest were healthy, or not judged yet for too little history), stacked. The per-cause alerts (LLMTTFTQueueing, "
        "LLMPrefixCacheMisses, LLMCPUBoundPreprocessing, ...) fire on this share per "
        "instance and model, above the thresholds of dashboards/thresholds.py. Read it with "
        "the panel beside it: a cause common here but thin there costs each request little; "
        "one rare here but wide there costs each request it hits a lot.",
        targets(("{{cause}}", share)), unit="percentunit", valueMin=0,
        stacking={"mode": "normal", "group": "A"}, fillOpacity=70, lineWidth=0,
        legendCalcs=["mean", "max"], overrides=_cause_colors())
