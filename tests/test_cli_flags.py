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
          "--probe-rate-per-s", "3.5", "--probe-burst", "9", "--no-tracing", "--no-diagnosis",
          "--no-ui",
          "--log-format", "json", "--forwarded-allow-ips", "10.0.0.0/8, 127.0.0.1",
          "--store", "sqlite:///srv/t.db", "--data-dir", "/srv", "--retention-days", "2",
          "--retention-max-mb", "64"]
EXPECTED = ObservabilitySettings(
    tracing=False, diagnosis=False, trace_store_capacity=77, store="sqlite:///srv/t.db",
    data_dir="/srv", retention_max_age_s=2 * 86400.0, retention_max_bytes=64 << 20,
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
    # One exception: the commands keep records in the default SQLite file (store None), a
    # library caller that builds the settings itself in memory unless it asks.
    assert observability_settings_from_args(parse([])) == ObservabilitySettings(store=None)


@pytest.mark.parametrize("parse", [_engine_args, _proxy_args, _collect_args],
                         ids=["engine", "proxy", "collect"])
def test_the_body_deadline_is_one_flag_with_one_default(parse):
    from tracer.web.cli_options import connection_limits_from_args
    from tracer.web.limits import ConnectionLimits

    assert connection_limits_from_args(parse([])).body_deadline_s == 60.0 == \
        ConnectionLimits().body_deadline_s   # the default docs/reference.md states
    assert connection_limits_from_args(parse(["--body-deadline-s", "12.5"])).body_deadline_s \
        == 12.5
    with pytest.raises(ValueError):
        connection_limits_from_args(parse(["--body-deadline-s", "0"]))


def test_the_engine_keeps_its_old_comma_list_spelling():
    args = _engine_args(["--cors-origins", "https://a.example, https://b.example"])
    assert observability_settings_from_args(args).cors_origins == (
        "https://a.example", "https://b.example")


def test_the_kv_block_default_is_the_engine_configs():
    assert _engine_args([]).num_kv_blocks == EngineConfig().num_kv_blocks


def test_serve_refuses_a_format_the_cpu_cannot_run_with_what_to_use_instead():
    """Torch capped at AVX2 (as on an AVX2-only CPU): forcing oneDNN's bf16 GEMM is refused
    before any weight is read, in one line, without a oneDNN stack trace."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    run = subprocess.run([sys.executable, "-m", "instrumented_engine", "serve", "--weight-format",
                          "bf16", "--port", "1"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "error: weight format 'bf16' needs oneDNN's bf16 GEMM, which needs AVX-512 BF16 (torch "
        f"reports AVX2, avx512_bf16={_host_has_avx512_bf16()}): use --weight-format auto "
        "(q4_1+int4+fp32 here), fp32 or dense"]


def _host_has_avx512_bf16() -> bool:
    import torch
    return bool(torch.cpu._is_avx512_bf16_supported())


def test_serve_parses_the_cpu_format_flags():
    args = _engine_args(["--dtype", "fp32", "--weight-format", "dense"])
    assert (args.dtype, args.weight_format) == ("fp32", "dense")
    with pytest.raises(SystemExit):
        _engine_args(["--weight-format", "int3"])
