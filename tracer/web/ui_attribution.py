"""`/ui/api/attribution`'s answer: the median share of TTFT per stage over recent requests,
and the network's share of the client's TTFT where a beacon joined.

Apart from the routes (tracer/web/ui_api.py) because it is an aggregate over many records,
the page's attribution bar, where the rest of the API shows one record or a window of them.
"""
from __future__ import annotations

import statistics

from tracer.record.request_record import RequestRecord
from tracer.record.stages import SERVER_STAGES, UNATTRIBUTED


def attribution_of(records: list[RequestRecord],
                   stages: tuple[str, ...] = SERVER_STAGES) -> dict:
    """Median share of TTFT per stage (of `stages`) over requests that produced a token.

    Medians of shares do not sum to 1 in general; the page scales the bar and prints the
    medians themselves. The client's network share is over requests with a joined beacon.
    """
    timed = [r for r in records if r.ttft_ns]
    shares = []
    for stage in stages + (UNATTRIBUTED,):
        durations_ns = [_stage_ns(r, stage) for r in timed]
        shares.append({
            "stage": stage,
            "median_share": statistics.median(d / r.ttft_ns for d, r in zip(durations_ns, timed))
            if timed else 0.0,
            "median_ms": statistics.median(durations_ns) / 1e6 if timed else 0.0})
    joined = [r for r in timed if r.client and r.client.get("network_overhead_ms") is not None
              and r.client.get("client_ttft_ms")]
    network = None
    if joined:
        network = {"num_requests": len(joined),
                   "median_ms": statistics.median(r.client["network_overhead_ms"] for r in joined),
                   "median_share_of_client_ttft": statistics.median(
                       r.client["network_overhead_ms"] / r.client["client_ttft_ms"]
                       for r in joined)}
    return {"num_requests": len(timed),
            "median_ttft_ms": statistics.median(r.ttft_ns for r in timed) / 1e6 if timed else None,
            "stages": shares, "network": network}


def _stage_ns(record: RequestRecord, stage: str) -> int:
    if stage == UNATTRIBUTED:
        return record.unattributed_ns
    return record.stage_ns(stage) or 0
