"""Issue 22 item 4: the proxy's API key cannot be walked around.

Open paths are the exact routes the proxy serves itself; everything the passthrough forwards
needs the key; a path with dot segments or encoded separators is refused before any routing;
a CORS preflight is never forwarded; the proxy's key never reaches the upstream. Requests go
over raw sockets so the paths arrive exactly as written (`curl --path-as-is`).
"""
from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from proxy_support import wait_until
from tracer.testing.fake_upstream import MODEL

KEY = "proxy-key-1"
UPSTREAM_KEY = "upstream-key-2"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
WALKS = ["/health/../v1/chat/completions", "/ui/%2e%2e/v1/models", "/ui/%2E%2E/v1/models",
         "/health/..%2fv1/models", "/v1%2fmodels", "/metrics/./../v1/models",
         "/v1/probe/%2e%2e/%2e%2e/v1/models", "/ui/..%5cv1/models", "/v1/models/.."]


def raw(base_url: str, method: str, target: str, headers: dict | None = None,
        body: bytes = b"") -> tuple[int, dict, bytes]:
    """One request with `target` sent byte for byte; (status, headers, body)."""
    url = urlsplit(base_url)
    head = [f"{method} {target} HTTP/1.1", f"host: {url.netloc}", "connection: close",
            f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), fields, rest


def seen_paths(upstream) -> list[str]:
    return [r.path for r in upstream.state.requests]


@pytest.mark.parametrize("api_key", [KEY, None])
@pytest.mark.parametrize("target", WALKS)
def test_dot_segments_and_encoded_separators_are_refused_unforwarded(
        fake_upstream, proxy_factory, target, api_key):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(api_key))
    headers = {"authorization": f"Bearer {KEY}"} if api_key else {}
    status, _, body = raw(proxy.base_url, "POST", target,
                          {**headers, "content-type": "application/json"}, CHAT)
    assert status == 400, body
    assert json.loads(body)["error"]["code"] == "invalid_path"
    assert seen_paths(fake_upstream) == []


@pytest.mark.parametrize("target", ["/health/x", "/ui/x", "/metrics/x", "/v1/probe/x",
                                    "/demo/x", "/probe/x.js", "/healthz", "/ui/api"])
def test_paths_under_the_open_ones_need_the_key_and_are_forwarded_only_with_it(
        fake_upstream, proxy_factory, target):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY))
    status, fields, body = raw(proxy.base_url, "GET", target)
    assert status == 401, body
    assert fields["www-authenticate"].startswith("Bearer")
    assert seen_paths(fake_upstream) == []
    status, _, _ = raw(proxy.base_url, "GET", target, {"authorization": f"Bearer {KEY}"})
    assert seen_paths(fake_upstream) == [target]   # with the key: the upstream's path


def test_the_open_paths_are_served_by_the_proxy_itself(fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY))
    for target in ("/health", "/ui/", "/ui/ui.js", "/probe/probe.js", "/demo"):
        status, _, body = raw(proxy.base_url, "GET", target)
        assert status == 200, (target, body[:200])
    assert raw(proxy.base_url, "GET", "/ui/api/requests")[0] == 401
    assert seen_paths(fake_upstream) == []


def test_head_is_answered_wherever_get_is_and_never_forwarded(fake_upstream, proxy_factory):
    """RFC 9110 §9.3.2: HEAD as GET, without the content; a load balancer's HEAD /health."""
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY))
    auth = {"authorization": f"Bearer {KEY}"}
    for target in ("/health", "/metrics", "/ui/", "/ui/api/requests"):
        _, get_fields, get_body = raw(proxy.base_url, "GET", target, auth)
        status, fields, body = raw(proxy.base_url, "HEAD", target, auth)
        assert (status, body) == (200, b""), (target, body[:200])
        assert fields["content-type"] == get_fields["content-type"]
        if target == "/health":    # the same representation: GET's length, announced
            assert int(fields["content-length"]) == len(get_body)

    def heads_seen():   # the proxy's /metrics reads the upstream's with a GET of its own
        return [r.path for r in fake_upstream.state.requests if r.method == "HEAD"]
    assert heads_seen() == []
    raw(proxy.base_url, "HEAD", "/v1/models", auth)     # not ours: the upstream's HEAD
    assert heads_seen() == ["/v1/models"]


def test_without_the_ui_its_paths_are_the_upstreams_behind_the_key(fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY, ui=False))
    assert raw(proxy.base_url, "GET", "/ui/ui.js")[0] == 401
    assert seen_paths(fake_upstream) == []


def test_a_wrong_method_on_our_own_path_is_a_405_with_allow_not_forwarded(
        fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY))
    auth = {"authorization": f"Bearer {KEY}"}
    for method, target, allow in (("GET", "/v1/chat/completions", "POST"),
                                  ("DELETE", "/health", "GET, HEAD"), ("PUT", "/v1/probe", "POST"),
                                  ("POST", "/ui/api/requests", "GET, HEAD")):
        status, fields, body = raw(proxy.base_url, method, target, auth)
        assert (status, fields.get("allow")) == (405, allow), body
        assert json.loads(body)["error"]["code"] == "method_not_allowed"
    assert seen_paths(fake_upstream) == []


def test_options_is_never_forwarded_without_the_key(fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY))
    preflight = {"origin": "https://chat.example", "access-control-request-method": "POST"}
    status, _, body = raw(proxy.base_url, "OPTIONS", "/v1/models")
    assert status == 401, body
    status, fields, body = raw(proxy.base_url, "OPTIONS", "/v1/models", preflight)
    assert status == 403 and "access-control-allow-origin" not in fields, body
    assert seen_paths(fake_upstream) == []
    raw(proxy.base_url, "OPTIONS", "/v1/models", {"authorization": f"Bearer {KEY}"})
    assert seen_paths(fake_upstream) == ["/v1/models"]   # a plain OPTIONS with the key


def test_a_preflight_is_answered_by_the_cors_layer(fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url,
                          **_keyed(KEY, cors_origins=("https://chat.example",)))
    for target in ("/v1/models", "/v1/chat/completions"):
        status, fields, _ = raw(proxy.base_url, "OPTIONS", target, {
            "origin": "https://chat.example", "access-control-request-method": "POST",
            "access-control-request-headers": "authorization"})
        assert status == 200 and fields["access-control-allow-origin"] == "https://chat.example"
    assert seen_paths(fake_upstream) == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
def test_the_proxys_key_never_reaches_the_upstream(fake_upstream, proxy_factory, path):
    proxy = proxy_factory(fake_upstream.base_url, **_keyed(KEY))
    response = _send(proxy.base_url, path, f"Bearer {KEY}")
    assert response.status_code == 200, response.text
    [seen] = fake_upstream.state.requests
    assert "authorization" not in seen.headers


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
def test_the_upstream_key_replaces_the_clients(fake_upstream, proxy_factory, path):
    proxy = proxy_factory(fake_upstream.base_url, upstream_api_key=UPSTREAM_KEY, **_keyed(KEY))
    assert _send(proxy.base_url, path, f"Bearer {KEY}").status_code == 200
    [seen] = fake_upstream.state.requests
    assert seen.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_without_a_proxy_key_the_clients_authorization_passes(fake_upstream, proxy_factory):
    proxy = proxy_factory(fake_upstream.base_url)
    assert _send(proxy.base_url, "/v1/chat/completions", "Bearer clients-own").status_code == 200
    [seen] = fake_upstream.state.requests
    assert seen.headers["authorization"] == "Bearer clients-own"


NGINX_CONF = """
daemon off; pid {prefix}/nginx.pid; error_log {prefix}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off; client_body_temp_path {prefix}/body; proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi; uwsgi_temp_path {prefix}/uwsgi; scgi_temp_path {prefix}/scgi;
  server {{
    listen 127.0.0.1:{port};
    # With a URI part, nginx passes the normalised path (dot segments resolved, %2e decoded).
    location / {{ proxy_pass http://127.0.0.1:{upstream_port}/; }}
  }}
}}
"""


@contextlib.contextmanager
def nginx_in_front_of(upstream, tmp_path):
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not shutil.which(binary):
        pytest.fail("nginx is not installed: apt-get install -y nginx")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=tmp_path, port=port, upstream_port=upstream.port))
    proc = subprocess.Popen([binary, "-p", str(tmp_path), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read()
        try:
            return httpx.get(base + "/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        assert wait_until(up, 30), "nginx did not start"
        upstream.state.requests.clear()
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_walk_through_a_real_nginx_upstream_is_refused(fake_upstream, proxy_factory, tmp_path):
    with nginx_in_front_of(fake_upstream, tmp_path) as nginx:
        # The hazard: nginx resolves the walk and reaches the completion route.
        status, _, _ = raw(nginx, "POST", "/health/../v1/chat/completions",
                           {"content-type": "application/json"}, CHAT)
        assert status == 200 and seen_paths(fake_upstream) == ["/v1/chat/completions"]
        fake_upstream.state.requests.clear()
        proxy = proxy_factory(nginx, **_keyed(KEY))
        for target in ("/health/../v1/chat/completions", "/ui/%2e%2e/v1/models"):
            status, _, body = raw(proxy.base_url, "POST", target,
                                  {"content-type": "application/json"}, CHAT)
            assert status == 400, body
        assert seen_paths(fake_upstream) == []


def _keyed(api_key: str | None, **observability) -> dict:
    from tracer.web.observability import ObservabilitySettings
    return {"observability": ObservabilitySettings(api_key=api_key, **observability)}


def _send(base_url: str, path: str, authorization: str) -> httpx.Response:
    headers = {"authorization": authorization}
    if path == "/v1/models":
        return httpx.get(base_url + path, headers=headers, timeout=10)
    return httpx.post(base_url + path, content=CHAT, timeout=10,
                      headers={**headers, "content-type": "application/json"})
