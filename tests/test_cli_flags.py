"""`instrumented_engine serve` and `tracer proxy` share one set of observability flags:
the same names, the same defaults, read into the same `ObservabilitySettings`."""
from __future__ import annotations

import argparse

import pytest

from instrumented_engine.__main__ import _parser as engine_parser
from instrumented_engine.engine.config import EngineConfig
from tracer.__main__ import build_parser as tracer_parser
from tracer.web.cli_options import observability_settings_from_args
from tracer.web.observability import ObservabilitySettings

SHARED = ["--cors-origin", "https://a.example", "--cors-origin", "https://b.example,https://c.example",
          "--max-body-bytes", "2048", "--trace-store-capacity", "77", "--probe-max-bytes", "999",
          "--probe-rate-per-s", "3.5", "--probe-burst", "9", "--no-tracing", "--no-ui",
          "--log-format", "json", "--forwarded-allow-ips", "10.0.0.0/8, 127.0.0.1"]
EXPECTED = ObservabilitySettings(
    tracing=False, trace_store_capacity=77,
    cors_origins=("https://a.example", "https://b.example", "https://c.example"),
    max_body_bytes=2048, probe_max_bytes=999, probe_rate_per_s=3.5, probe_burst=9, ui=False,
    forwarded_allow_ips=("10.0.0.0/8", "127.0.0.1"))


def _engine_args(argv: list[str]) -> argparse.Namespace:
    return engine_parser().parse_args(["serve", *argv])


def _proxy_args(argv: list[str]) -> argparse.Namespace:
    return tracer_parser().parse_args(["proxy", "--upstream", "http://127.0.0.1:1", *argv])


def _collect_args(argv: list[str]) -> argparse.Namespace:
    return tracer_parser().parse_args(["collect", *argv])


@pytest.mark.parametrize("parse", [_engine_args, _proxy_args, _collect_args],
                         ids=["engine", "proxy", "collect"])
def test_the_same_flags_give_the_same_settings(parse):
    assert observability_settings_from_args(parse(SHARED)) == EXPECTED


@pytest.mark.parametrize("parse", [_engine_args, _proxy_args, _collect_args],
                         ids=["engine", "proxy", "collect"])
def test_no_flags_give_the_settings_defaults(parse):
    assert observability_settings_from_args(parse([])) == ObservabilitySettings()


def test_the_engine_keeps_its_old_comma_list_spelling():
    args = _engine_args(["--cors-origins", "https://a.example, https://b.example"])
    assert observability_settings_from_args(args).cors_origins == (
        "https://a.example", "https://b.example")


def test_the_kv_block_default_is_the_engine_configs():
    assert _engine_args([]).num_kv_blocks == EngineConfig().num_kv_blocks
