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
                                  ("--engine-clock-skew-ms", "-1"),
                                  ("--otlp-grpc-read-timeout-s", "0")])
def test_bad_values_are_refused(argv):
    with pytest.raises(ValueError):
        _settings(*argv)


def test_the_receiver_token_is_never_the_client_key():
    # Issue 39, break 7: one secret for clients, another for the engines' spans.
    with pytest.raises(ValueError, match="must not be the --api-key"):
        _settings("--api-key", "same", "--otlp-receiver-token", "same")
    given = _settings("--api-key", "client-key", "--otlp-receiver-token", "otlp-token")
    assert (given.observability.api_key, given.otlp_receiver_token) == ("client-key", "otlp-token")
