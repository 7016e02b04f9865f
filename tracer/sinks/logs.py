"""structlog setup and the one log line each finished request writes."""
from __future__ import annotations

import json
import logging
import sys
import weakref
from functools import partial
from datetime import datetime, timezone
from typing import Literal, TextIO

import structlog

from tracer.record.block_chain import export_fields
from tracer.record.errors import error_type_of
from tracer.record.output_segments import output_fields
from tracer.record.request_record import RequestRecord
from tracer.record.stages import UNATTRIBUTED
from tracer.sinks.json_text import json_writer

_NS_PER_MS = 1e6


def configure_logging(fmt: Literal["auto", "json", "console"] = "auto",
                      stream: TextIO | None = None,
                      level: int = logging.INFO) -> structlog.typing.FilteringBoundLogger:
    """A logger writing to `stream` (stderr by default): JSON lines, or a human console format.

    `auto` picks the console renderer when the stream is a TTY and JSON otherwise (what log
    shippers read). Touches no global structlog or logging state, so tests and several
    tracers in one process do not interfere.

    >>> import io, json
    >>> buf = io.StringIO()
    >>> configure_logging("json", buf).info("hello", n=1)
    >>> json.loads(buf.getvalue())["n"]
    1
    """
    stream = sys.stderr if stream is None else stream
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {fmt!r}")
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    as_json = fmt == "json" or (fmt == "auto" and not is_tty)
    if as_json:
        renderer = structlog.processors.JSONRenderer(serializer=_json_dumps)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=is_tty)
    output = structlog.WriteLogger(stream)
    logger = structlog.wrap_logger(
        output,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        # Bound once, at the first line, not again for every line (the lazy proxy's
        # default): the configuration is this call's own, never structlog's global one.
        cache_logger_on_first_use=True,
    )
    if as_json:
        _OWN_JSON[logger] = (output.msg, level, partial(renderer._dumps, **renderer._dumps_kw))
    return logger


# The JSON loggers `configure_logging` made -> (their output's `msg`, their level, their
# renderer's serializer as the renderer calls it): the request line is rendered for them
# without structlog's chain (`RequestLogSink`).
_OWN_JSON: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_WRITERS: dict = {}   # `default` -> its JSON writer


def _json_dumps(obj, *, default=None) -> str:
    """`json.dumps(obj, default=default)`'s values, written by orjson where it can
    (tracer/sinks/json_text.py), with one writer per `default`, made once (the JSON
    renderer's serializer: a log line per request).

    >>> line = _json_dumps({"a": [1, 2.5, None], "b": "é"})
    >>> json.loads(line) == {"a": [1, 2.5, None], "b": "é"}
    True
    """
    writer = _WRITERS.get(default)
    if writer is None:
        writer = _WRITERS[default] = json_writer(default=default)
    return writer(obj)


def _ms(duration_ns: int | None) -> float | None:
    # No rounding: round() would double this function's cost, and ns / 1e6 is exact enough.
    return None if duration_ns is None else duration_ns / _NS_PER_MS


def request_fields(record: RequestRecord) -> dict:
    """The fields of a request's log line (also handy for the UI and tests)."""
    stage_ms = {span.stage: (span.end_ns - span.start_ns) / _NS_PER_MS for span in record.stages}
    stage_ms[UNATTRIBUTED] = record.unattributed_ns / _NS_PER_MS
    return {
        "trace_id": record.trace_id,
        "span_id": record.span_id,
        "request_id": record.request_id,
        "model": record.model,
        "operation": record.operation,
        "source": record.source,
        "stage_ms": stage_ms,
        "ttft_ms": _ms(record.ttft_ns),
        # The first output of any kind, and tool calls (docs/architecture.md, "First output,
        # by kind").
        **output_fields(record),
        "tpot_ms": _ms(record.tpot_ns),
        "e2e_ms": _ms(record.e2e_ns),
        "prompt_tokens": record.num_prompt_tokens,
        "cached_tokens": record.num_cached_tokens,
        "output_tokens": record.num_output_tokens,
        "finish_reason": record.finish_reason,
        "error_type": record.error_type,
        **verdict_fields(record.verdict),
        # The trace export's inputs (docs/reference.md, "Trace export (Mooncake JSONL)").
        **export_fields(record),
    }


def verdict_fields(verdict) -> dict:
    """The verdict's log fields (`cause`, `excess_ms`, `evidence`, `action` and the `engine`
    it names; see tracer/record/verdict.py), empty before the record was judged."""
    if verdict is None:
        return {}
    return {"cause": verdict.cause, "excess_ms": verdict.excess_ms,
            "evidence": dict(verdict.evidence), "action": verdict.action,
            "engine": verdict.engine}


def log_request(logger, record: RequestRecord) -> None:
    """One `request_finished` line per request; warning level when the request failed."""
    failed = error_type_of(record) is not None
    (logger.warning if failed else logger.info)("request_finished", **request_fields(record))


class RequestLogSink:
    """One structured log line per finished request, on `logger` (a structlog logger).

    For a JSON logger of `configure_logging`, the line is rendered here: the event dict its
    chain would build (the fields, `event`, `level`, the ISO UTC `timestamp`, in that
    order), written by the same serializer to the same output under the same lock; the same
    line (tests/tracer/test_logs.py compares them), at about half the cost of the chain's
    calls (the keyword expansions, a copy of the dict, the processors). Any other logger
    gets the line through its own chain."""

    name = "logs"

    def __init__(self, logger) -> None:
        self.logger = logger
        try:
            self._direct = _OWN_JSON.get(logger)
        except TypeError:   # not weak-referenceable: not one of ours
            self._direct = None

    def publish(self, record: RequestRecord) -> None:
        if self._direct is None:
            log_request(self.logger, record)
            return
        write, min_level, render = self._direct
        failed = error_type_of(record) is not None
        if (logging.WARNING if failed else logging.INFO) < min_level:
            return   # as the filtering logger drops it
        fields = request_fields(record)
        fields["event"] = "request_finished"
        fields["level"] = "warning" if failed else "info"
        fields["timestamp"] = datetime.now(tz=timezone.utc).isoformat().replace("+00:00", "Z")
        write(render(fields))
