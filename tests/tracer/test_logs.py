"""Log setup and the `request_finished` line."""
from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from tracer.record.emits import GapSummary
from tracer.sinks.logs import configure_logging, log_request
from tracer.record.request_record import RequestRecord, StageSpan
from tracer.record.stages import SERVER_STAGES


class _TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(**overrides) -> RequestRecord:
    t_ns, stages = 1_000_000, []
    for i, stage in enumerate(SERVER_STAGES):
        stages.append(StageSpan(stage, t_ns, t_ns + (i + 1) * 250_000))
        t_ns += (i + 1) * 250_000
    fields = dict(request_id="req-1", trace_id="a" * 32, span_id="b" * 16, model="smollm2",
                  operation="chat", start_ns=1_000_000, end_ns=t_ns + 40_000_000,
                  stages=tuple(stages), unattributed_ns=1_500, ttft_ns=t_ns - 1_000_000 + 1_500,
                  itl=GapSummary.of((10_000_000, 30_000_000)), num_prompt_tokens=12,
                  num_cached_tokens=8, num_output_tokens=3)
    fields.update(overrides)
    return RequestRecord(**fields)


def _one_json_line(buf: io.StringIO) -> dict:
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_request_line_has_every_field_in_ms():
    buf = io.StringIO()
    record = _record()
    log_request(configure_logging("json", buf), record)
    line = _one_json_line(buf)
    assert line["event"] == "request_finished" and line["level"] == "info"
    assert "timestamp" in line
    for key in ("trace_id", "span_id", "request_id", "model", "operation", "finish_reason"):
        assert line[key] == getattr(record, key)
    assert line["error_type"] is None
    assert line["stage_ms"] == {**{s: (i + 1) * 0.25 for i, s in enumerate(SERVER_STAGES)},
                                "unattributed": 0.0015}
    assert line["ttft_ms"] == pytest.approx(record.ttft_ns / 1e6)
    assert line["tpot_ms"] == 20.0
    assert line["e2e_ms"] == pytest.approx(record.e2e_ns / 1e6)
    assert (line["prompt_tokens"], line["cached_tokens"], line["output_tokens"]) == (12, 8, 3)


def test_failed_request_logs_a_warning_with_nulls_for_missing_timings():
    buf = io.StringIO()
    record = _record(stages=(), unattributed_ns=0, ttft_ns=None, itl=GapSummary.of(()),
                     finish_reason="abort", error_type="client_disconnected")
    log_request(configure_logging("json", buf), record)
    line = _one_json_line(buf)
    assert line["level"] == "warning"
    assert line["ttft_ms"] is None and line["tpot_ms"] is None
    assert line["stage_ms"] == {"unattributed": 0.0}
    assert (line["finish_reason"], line["error_type"]) == ("abort", "client_disconnected")


def test_auto_is_json_off_a_tty_and_console_on_one():
    plain, tty = io.StringIO(), _TtyStream()
    configure_logging("auto", plain).info("hello", n=1)
    configure_logging("auto", tty).info("hello", n=1)
    assert json.loads(plain.getvalue())["n"] == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(tty.getvalue())
    assert "hello" in tty.getvalue() and "n" in tty.getvalue()


def test_console_format_is_human_readable_and_colourless_off_a_tty():
    buf = io.StringIO()
    log_request(configure_logging("console", buf), _record())
    text = buf.getvalue()
    assert "request_finished" in text and "trace_id" in text
    assert "\x1b[" not in text


def test_levels_below_the_threshold_are_dropped():
    buf = io.StringIO()
    logger = configure_logging("json", buf)
    logger.debug("noise")
    assert buf.getvalue() == ""


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError):
        configure_logging("xml", io.StringIO())


def test_no_global_structlog_state_is_touched():
    before = structlog.get_config()
    configure_logging("json", io.StringIO())
    assert structlog.get_config() == before


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING, logging.ERROR])
@pytest.mark.parametrize("overrides", [
    {}, {"error_type": "engine_error", "finish_reason": "error", "ttft_ns": None},
    {"attrs": {"odd": "\udc80", "big": 2**70}},     # what only `json` writes, via the fallback
])
def test_the_sinks_own_rendering_writes_the_chains_line(level, overrides):
    """`RequestLogSink` renders the line itself for a `configure_logging` JSON logger: the
    same line as the structlog chain (`log_request`), the timestamp aside, and the same
    level filtering."""
    from tracer.sinks.logs import RequestLogSink
    record = _record(**overrides)
    chain_buf, own_buf = io.StringIO(), io.StringIO()
    log_request(configure_logging("json", chain_buf, level=level), record)
    sink = RequestLogSink(configure_logging("json", own_buf, level=level))
    assert sink._direct is not None
    sink.publish(record)
    chain, own = chain_buf.getvalue(), own_buf.getvalue()
    assert len(chain.splitlines()) == len(own.splitlines()) <= 1
    if chain:
        stamp = json.loads(chain)["timestamp"]
        assert own.replace(json.loads(own)["timestamp"], stamp) == chain
        assert stamp.endswith("Z")


def test_another_logger_gets_the_line_through_its_own_chain():
    from tracer.sinks.logs import RequestLogSink
    seen = []
    logger = structlog.wrap_logger(None, processors=[lambda _l, _m, ev: seen.append(ev) or ""])
    sink = RequestLogSink(logger)
    assert sink._direct is None
    sink.publish(_record())
    assert seen and seen[0]["event"] == "request_finished"
