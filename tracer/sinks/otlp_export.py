"""The OTLP/HTTP span export ttftscope installs: the SDK's batch processor and exporter,
with each span encoded (by `tracer.sinks.otlp_encoding`) when it ends, on the thread that ends it.

Why: the SDK encodes a batch on the processor's thread, ~20 us of Python per span, and the
event loop then waits for the GIL whenever a relayed chunk arrives during an export. Measured
with `bench/proxy_overhead.py` at 32 streams: p99 TTFT +4.9 ms over nginx with the SDK's
export, +2.3 ms with spans built but never exported. Encoded where they end (~8 us per span,
no thread handoff), the export thread only joins bytes and POSTs them.

Everything else (queue, batching, flush, shutdown, endpoint, headers, TLS, compression,
retries, the exporter's own metrics) stays the SDK's. The fast path needs two SDK internals
(`BatchSpanProcessor._batch_processor`, `OTLPSpanExporter._client`, 1.45); without them the
SDK's own path runs, so a changed SDK is slower, never broken, and
tests/tracer/test_otlp_export.py fails to say so. Hence the OTel packages are pinned exactly
in pyproject.toml (issue 15): bump them together, on purpose, with that test green.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from tracer.sinks.export_drops import EXPORT_DROPS, ExportDrops
from tracer.sinks.otlp_encoding import EncodedSpan, TraceRequestEncoder

_EXPORTER_PARTS = ("_client", "_metrics", "_max_request_size", "_shutdown")
# What `on_end_encoded_many` reads of the SDK's BatchProcessor (1.45), checked when the
# processor is made: without one of them it calls `emit` once a span.
_EMIT_PARTS = ("_shutdown", "_metrics", "_pid", "_bsp_reset_once", "_at_fork_reinit", "_queue",
               "_max_queue_size", "_exporting", "_max_export_batch_size", "_worker_awaken")
_log = logging.getLogger(__name__)


def _too_large(data: bytes, max_request_size: int | None) -> bool:
    """The SDK's rule (1.45 `_is_request_too_large`): the constructor turns `None` into its
    64 MiB default; a limit of 0 or below means *no limit*, not "drop every batch".

    >>> _too_large(b"x" * 10, 0), _too_large(b"x" * 10, -1), _too_large(b"x" * 10, None)
    (False, False, False)
    >>> _too_large(b"x" * 10, 9), _too_large(b"x" * 10, 10)
    (True, False)
    """
    return max_request_size is not None and 0 < max_request_size < len(data)


class FastOTLPSpanExporter(OTLPSpanExporter):
    """`OTLPSpanExporter` that takes `EncodedSpan`s (or spans, encoded ~3x cheaper than the
    SDK does) and POSTs them with the SDK's HTTP client.

    >>> FastOTLPSpanExporter(endpoint="http://127.0.0.1:4318/v1/traces").fast_path
    True
    """

    def __init__(self, *args, drops: ExportDrops = EXPORT_DROPS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._encoder = TraceRequestEncoder()
        self.drops = drops
        self.fast_path = all(hasattr(self, part) for part in _EXPORTER_PARTS)

    def export(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> SpanExportResult:
        if not self.fast_path or self._shutdown:
            sdk_spans = [s for s in spans if isinstance(s, ReadableSpan)]
            result = super().export(sdk_spans)
            if result is not SpanExportResult.SUCCESS:
                self.drops.span_dropped("shutdown" if self._shutdown else "export_failed",
                                        len(sdk_spans))
            return result
        return self._export_encoded(spans)

    def _export_encoded(self, spans: Sequence[ReadableSpan | EncodedSpan]) -> SpanExportResult:
        data = self._encoder.encode(spans)
        if _too_large(data, self._max_request_size):
            if len(spans) > 1:
                # Halves until each request fits: one huge span costs only itself, never
                # the other requests' spans that happen to share its batch.
                half = len(spans) // 2
                first = self._export_encoded(spans[:half])
                second = self._export_encoded(spans[half:])
                return (SpanExportResult.SUCCESS if first is second is SpanExportResult.SUCCESS
                        else SpanExportResult.FAILURE)
            _log.warning("ttftscope: dropping a span: %d bytes exceed the exporter's "
                         "max_request_size", len(data))
            self.drops.span_dropped("too_large")
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(len(spans)) as result:
            try:
                outcome = self._client.export(data)
            except Exception:
                self.drops.span_dropped("export_failed", len(spans))
                raise
            if not outcome.success:
                result.error = outcome.error
                self.drops.span_dropped("export_failed", len(spans))
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


class EncodingBatchSpanProcessor(BatchSpanProcessor):
    """`BatchSpanProcessor` that queues each sampled span already encoded.

    >>> processor = EncodingBatchSpanProcessor(
    ...     FastOTLPSpanExporter(endpoint="http://127.0.0.1:4318/v1/traces"))
    >>> processor.fast_path
    True
    >>> processor.shutdown()
    """

    def __init__(self, exporter: FastOTLPSpanExporter, *, drops: ExportDrops = EXPORT_DROPS,
                 **kwargs) -> None:
        super().__init__(exporter, **kwargs)
        self.drops = drops
        self.fast_path = (getattr(exporter, "fast_path", False)
                          and hasattr(self, "_batch_processor"))
        batch = getattr(self, "_batch_processor", None)
        self._emits_many = batch is not None and all(hasattr(batch, p) for p in _EMIT_PARTS)
        if batch is not None and hasattr(batch, "_metrics"):
            # The SDK calls `_metrics.drop_items` exactly where it drops a span (queue full,
            # or emitted after shutdown): counted there, not guessed from the queue length.
            batch._metrics = _CountingDrops(batch._metrics, drops)

    def on_end(self, span: ReadableSpan) -> None:
        if not self.fast_path:
            return super().on_end(span)
        if not (span.context and span.context.trace_flags.sampled):
            return
        try:
            encoded = EncodedSpan.of(span)
        except Exception:   # noqa: BLE001 — e.g. a span name with a lone surrogate
            _log.exception("ttftscope: dropping a span the OTLP encoder cannot write")
            self.drops.span_dropped("encode_failed")
            return
        self._batch_processor.emit(encoded)

    def on_end_encoded(self, encoded: EncodedSpan) -> None:
        """A sampled span its builder encoded itself (`tracer.sinks.spans.SpanBuilder`, from
        a finished record, without a `ReadableSpan`): queued as `on_end` queues it. Only on
        the fast path (`fast_path`), which the builder checks before choosing this."""
        self._batch_processor.emit(encoded)

    def on_end_encoded_many(self, spans: list[EncodedSpan]) -> None:
        """`on_end_encoded` for each of a request's spans, in order, with the SDK's `emit`
        done once for all of them: its checks (shut down? forked? full?) once a request,
        not once a span (each asks the kernel for the process id: ~1 µs on a VM, ten a
        request). The same queue, the same drops counted (tests/tracer/test_otlp_export.py
        compares them with `emit` called once a span), from `BatchProcessor.emit` of the
        pinned SDK (1.45): items enter at the left, a full queue loses its oldest at the
        right."""
        batch = self._batch_processor
        if not self._emits_many:
            for encoded in spans:
                batch.emit(encoded)
            return
        n = len(spans)
        if batch._shutdown:
            batch._metrics.drop_items(n, "already_shutdown")
            return
        if batch._pid != os.getpid():
            batch._bsp_reset_once.do_once(batch._at_fork_reinit)
        queue = batch._queue
        overflow = len(queue) + n - batch._max_queue_size
        if overflow > 0:
            _log.warning("Queue full, dropping %s.", batch._exporting)
            batch._metrics.drop_items(overflow)
        queue.extendleft(spans)
        if len(queue) >= batch._max_export_batch_size and not batch._worker_awaken.is_set():
            batch._worker_awaken.set()


class _CountingDrops:
    """The SDK batch processor's own metrics object, with its drops also counted in ours."""

    def __init__(self, inner, drops: ExportDrops) -> None:
        self._inner = inner
        self._drops = drops

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        self._drops.span_dropped("shutdown" if error_type == "already_shutdown"
                                 else "queue_full", count)
        self._inner.drop_items(count, error_type)

    def __getattr__(self, name):
        return getattr(self._inner, name)
