"""Issue 22 item 4, on the engine server: the API key gate judges the path as sent. Dot
segments and encoded separators are a 400 before routing; the open paths are exact, so a path
under one needs the key. Raw sockets, so the paths arrive exactly as written."""
from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from instrumented_engine.server.app import ServerSettings
from tracer.web.observability import ObservabilitySettings

KEY = "engine-key-4"


def _raw(base_url: str, method: str, target: str, headers: dict | None = None,
         ) -> tuple[int, bytes, str]:
    """(status, body, the raw head) of one request with `target` sent byte for byte."""
    url = urlsplit(base_url)
    head = [f"{method} {target} HTTP/1.1", f"host: {url.netloc}", "connection: close",
            "content-length: 0", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), body, head_bytes.decode("latin-1").lower()


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(ServerSettings(ObservabilitySettings(api_key=KEY)))


@pytest.mark.parametrize("target", ["/health/../v1/models", "/ui/%2e%2e/v1/models",
                                    "/ui/%2E%2E/ui/api/requests", "/v1%2Fmodels", "/ui/..%5c",
                                    "/./v1/models"])
def test_walks_are_refused_with_or_without_the_key(srv, target):
    for headers in ({}, {"authorization": f"Bearer {KEY}"}):
        status, body, _ = _raw(srv.base_url, "GET", target, headers)
        assert status == 400, body
        assert json.loads(body)["error"]["code"] == "invalid_path"


def test_open_paths_are_exact(srv):
    assert _raw(srv.base_url, "GET", "/health")[0] == 200
    assert _raw(srv.base_url, "GET", "/ui/ui.js")[0] == 200
    for target in ("/health/x", "/ui/x", "/metrics/x"):
        assert _raw(srv.base_url, "GET", target)[0] == 401
        assert _raw(srv.base_url, "GET", target, {"authorization": f"Bearer {KEY}"})[0] == 404


def test_a_wrong_method_is_a_405_with_allow(srv):
    status, body, head = _raw(srv.base_url, "DELETE", "/v1/models",
                              {"authorization": f"Bearer {KEY}"})
    allow = next(line.split(":", 1)[1] for line in head.split("\r\n")
                 if line.startswith("allow:"))
    # HEAD wherever GET is (tracer/web/routes.py); Starlette lists a route's methods unordered
    assert status == 405 and {m.strip() for m in allow.split(",")} == {"get", "head"}, head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
