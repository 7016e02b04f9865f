"""Alert thresholds shared by the dashboards (threshold lines) and the rendered alert rules.

One place to change them; `prometheus/render_rules.py` overrides them per run
(the live test renders a low TTFT threshold into a temporary directory).

>>> AlertThresholds().ttft_p95_s
2.0
"""
from __future__ import annotations

from dataclasses import dataclass

# The TTFT objective the diagnosis ranks causes against (`/ui/api/diagnosis`,
# `python -m tracer diagnose`): the page fires at the same number.
from tracer.record.diagnosis_window import DEFAULT_TTFT_SLO_S

# The share thresholds, validated to lie in (0, 1].
_SHARES = ("stage_share", "buffered_share", "queueing_share", "long_prompt_share",
           "prefix_cache_miss_share", "slow_prefill_share", "cpu_preprocessing_share",
           "network_share", "slow_kv_transfer_share", "backend_share")


@dataclass(slots=True, frozen=True)
class AlertThresholds:
    """What "too slow" means; the defaults are what the committed files carry.

    >>> AlertThresholds(ttft_p95_s=0.05).for_duration
    '5m'
    """

    ttft_p95_s: float = DEFAULT_TTFT_SLO_S  # server TTFT p95 (recorded over 5m) above this pages
    client_ttft_p95_s: float = 3.0   # browser-measured TTFT p95: server + network + gateway
    stage_share: float = 0.5         # one stage's p95 above this share of TTFT p95 dominates
    # Share of the judged streams (3+ content events) an intermediary held back
    # (tracer/web/probe/buffering.py) above which LLMStreamBuffered fires.
    buffered_share: float = 0.1
    # Share of a model's TTFT verdicts (llm:ttft_cause:ratio_rate5m) naming one cause, above
    # which that cause's alert fires. A verdict names a cause only when it cost at least
    # 10 ms and a quarter of the model's normal TTFT (tracer/record/verdict.py), so these
    # count requests that were noticeably slower, not merely slower. Some queueing is what a
    # busy engine does, hence the higher bar; a shared prompt missing the prefix cache or a
    # starved CPU is a configuration to fix however few requests it hits.
    queueing_share: float = 0.2
    long_prompt_share: float = 0.1
    prefix_cache_miss_share: float = 0.1
    slow_prefill_share: float = 0.1
    cpu_preprocessing_share: float = 0.1
    network_share: float = 0.1
    slow_kv_transfer_share: float = 0.1
    backend_share: float = 0.1      # the collector's whole-path verdicts
    for_duration: str = "5m"         # how long a condition must hold before it fires
    # Where Alertmanager posts: the compose service dashboards/alert_receiver/receiver.py.
    webhook_url: str = "http://alert-receiver:9095/alerts"
    # Where the alerts' runbook_url points (one section per cause, `#<cause>`): the repo's
    # page; a deployment that serves its docs elsewhere renders its own URL. Single quotes:
    # a path followed by a double quote reads as a docs citation (tests/test_docs_citations.py).
    runbook_url: str = 'docs/runbook.md'

    def __post_init__(self) -> None:
        for name in ("ttft_p95_s", "client_ttft_p95_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in _SHARES:
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")


DEFAULT_THRESHOLDS = AlertThresholds()
