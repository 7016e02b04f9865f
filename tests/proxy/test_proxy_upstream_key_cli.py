"""`--upstream-api-key`, its env var and `--upstream-api-key-file` reach the proxy's settings,
and a bad combination is refused in one line (tracer/proxy/cli.py)."""
from __future__ import annotations

import argparse

import pytest

from tracer.proxy.cli import add_proxy_arguments, settings_from_args


def _settings(argv: list[str], monkeypatch, env: str | None = None):
    if env is None:
        monkeypatch.delenv("TTFTSCOPE_UPSTREAM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("TTFTSCOPE_UPSTREAM_API_KEY", env)
    parser = argparse.ArgumentParser()
    add_proxy_arguments(parser)   # reads the env var's default now
    return settings_from_args(parser.parse_args(["--upstream", "http://127.0.0.1:9", *argv]))


def test_no_upstream_key_by_default(monkeypatch):
    assert _settings([], monkeypatch).upstream_api_key is None


def test_the_env_var_and_the_flag(monkeypatch):
    assert _settings([], monkeypatch, env="from-env").upstream_api_key == "from-env"
    assert _settings(["--upstream-api-key", "flag"], monkeypatch).upstream_api_key == "flag"


def test_the_file_form_reads_its_first_line(monkeypatch, tmp_path):
    secret = tmp_path / "key"
    secret.write_text("from-file\nignored\n")
    settings = _settings(["--upstream-api-key-file", str(secret)], monkeypatch)
    assert settings.upstream_api_key == "from-file"
    assert "from-file" not in repr(settings)   # never printed with the settings


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_a_missing_or_empty_file_is_refused(monkeypatch, tmp_path, content):
    secret = tmp_path / "key"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(ValueError, match="--upstream-api-key-file"):
        _settings(["--upstream-api-key-file", str(secret)], monkeypatch)


def test_the_key_given_twice_is_refused(monkeypatch, tmp_path):
    secret = tmp_path / "key"
    secret.write_text("from-file\n")
    with pytest.raises(ValueError, match="once"):
        _settings(["--upstream-api-key-file", str(secret)], monkeypatch, env="from-env")
