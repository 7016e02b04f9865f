"""Alert thresholds shared by the dashboards (threshold lines) and the rendered alert rules.

One place to change them; `prometheus/render_rules.py` overrides them per run
(the live test renders a low TTFT threshold into a temporary directory).

>>> AlertThresholds().ttft_p95_s
2.0
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class AlertThresholds:
    """What "too slow" means; the defaults are what the committed files carry.

    >>> AlertThresholds(ttft_p95_s=0.05).for_duration
    '5m'
    """

    ttft_p95_s: float = 2.0          # server TTFT p95 (recorded over 5m) above this pages
    client_ttft_p95_s: float = 3.0   # browser-measured TTFT p95: server + network + gateway
    stage_share: float = 0.5         # one stage's p95 above this share of TTFT p95 dominates
    # Share of the judged streams (3+ content events) an intermediary held back
    # (tracer/web/probe/buffering.py) above which LLMStreamBuffered fires.
    buffered_share: float = 0.1
    for_duration: str = "5m"         # how long a condition must hold before it fires
    # Where Alertmanager posts: the compose service dashboards/alert_receiver/receiver.py.
    webhook_url: str = "http://alert-receiver:9095/alerts"

    def __post_init__(self) -> None:
        for name in ("ttft_p95_s", "client_ttft_p95_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("stage_share", "buffered_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")


DEFAULT_THRESHOLDS = AlertThresholds()
