"""What OTLP span export lost, counted process-wide: whole spans by reason, and attributes.

Apart from the encoding because three places count into it and one reads it: the attribute
encoder (tracer/sinks/otlp_attributes.py) drops what the SDK's encoder would refuse, the
span processor and exporter (tracer/sinks/otlp_export.py) drop spans, and the Prometheus
collector of tracer/web/observability.py reads the counts at scrape time.
"""
from __future__ import annotations

import threading


class ExportDrops:
    """Process-wide counts of what span export lost, read by the Prometheus collector that
    `tracer.web.observability` registers (docs/reference.md, "Metrics").

    `spans[reason]` counts whole spans: `queue_full` (the batch queue was full),
    `shutdown` (ended after the processor shut down), `export_failed` (the collector refused
    or was unreachable), `too_large` (a span alone exceeds the exporter's max_request_size),
    `encode_failed` (a span the encoder could not write); `attributes` counts attributes
    dropped from spans that were exported.

    >>> drops = ExportDrops(); drops.span_dropped("queue_full", 2); drops.attribute_dropped()
    >>> drops.snapshot()
    (1, {'queue_full': 2, 'shutdown': 0, 'export_failed': 0, 'too_large': 0, 'encode_failed': 0})
    """

    REASONS = ("queue_full", "shutdown", "export_failed", "too_large", "encode_failed")

    def __init__(self) -> None:
        self._lock = threading.Lock()   # counted from the finishing and the export threads
        self._attributes = 0
        self._spans = dict.fromkeys(self.REASONS, 0)

    def attribute_dropped(self, n: int = 1) -> None:
        with self._lock:
            self._attributes += n

    def span_dropped(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._spans[reason] += n

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return self._attributes, dict(self._spans)


EXPORT_DROPS = ExportDrops()
