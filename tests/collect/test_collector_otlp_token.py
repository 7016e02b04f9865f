"""Issue 39, break 7, on the collector: its receiver's token is a secret of its own
(`--otlp-receiver-token`), never the clients' `--api-key`, which the collector refuses: it
has no key gate, so the key would protect nothing but the receiver."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tracer.__main__ import build_parser
from tracer.collect.app import CollectorSettings, create_collector_app
from tracer.collect.cli import settings_from_args
from tracer.web.observability import ObservabilitySettings

PROTOBUF = {"content-type": "application/x-protobuf"}


def _collect(*argv: str):
    return settings_from_args(build_parser().parse_args(["collect", "--beacon-key", "k", *argv]))


def test_the_api_key_is_refused_and_the_token_is_its_own(monkeypatch):
    monkeypatch.delenv("TTFTSCOPE_OTLP_RECEIVER_TOKEN", raising=False)
    with pytest.raises(ValueError, match="--otlp-receiver-token"):
        _collect("--api-key", "client-key")
    with pytest.raises(ValueError, match="no API key gate"):
        create_collector_app(CollectorSettings(ObservabilitySettings(beacon_key="k",
                                                                     api_key="client-key")),
                             registry=CollectorRegistry(), environ={})
    settings = _collect("--otlp-receiver-token", "otlp-token")
    assert settings.otlp_receiver_token == "otlp-token"
    parts = create_collector_app(settings, registry=CollectorRegistry(), environ={})
    with TestClient(parts.app) as client:
        assert client.post("/v1/traces", content=b"", headers=PROTOBUF).status_code == 401
        assert client.post("/v1/traces", content=b"", headers={
            **PROTOBUF, "authorization": "Bearer otlp-token"}).status_code == 200
