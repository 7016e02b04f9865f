"""The proxy's engine-join flags reach its settings; bad values are refused."""
from __future__ import annotations

import pytest

from tracer.__main__ import build_parser
from tracer.proxy.cli import settings_from_args
from tracer.proxy.engine_join import JoinSettings


def _settings(*argv: str):
    return settings_from_args(build_parser().parse_args(
        ["proxy", "--upstream", "http://127.0.0.1:1", *argv]))


def test_defaults_and_flags():
    default = _settings()
    assert default.otlp_receiver and default.join == JoinSettings()
    given = _settings("--no-otlp-receiver", "--otlp-receiver-token", "t",
                      "--otlp-receiver-max-bytes", "1000", "--engine-join-wait-s", "2.5",
                      "--engine-join-max-pending", "7", "--engine-clock-skew-ms", "20",
                      "--engine-spans-expected")
    assert (given.otlp_receiver, given.otlp_receiver_token, given.otlp_receiver_max_bytes) == (
        False, "t", 1000)
    assert given.join == JoinSettings(wait_s=2.5, max_pending=7, max_skew_s=0.02,
                                      spans_expected=True)


@pytest.mark.parametrize("argv", [("--engine-join-wait-s", "0"),
                                  ("--engine-join-max-pending", "0"),
                                  ("--engine-clock-skew-ms", "-1")])
def test_bad_values_are_refused(argv):
    with pytest.raises(ValueError):
        _settings(*argv)
