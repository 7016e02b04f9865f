"""An https:// upstream with a self-signed certificate on loopback (issue 13, item 3): the
proxy verifies it against `--upstream-ca-file`, and without that CA refuses it (verification
is never turned off silently).

The certificate is made per test run with the `openssl` CLI (the `cryptography` package is
not a dependency of this project).
"""
from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading

import httpx
import pytest

from tracer.proxy.app import upstream_tls_context
from tracer.proxy.cli import add_proxy_arguments, settings_from_args
from tracer.proxy.upstream import Upstream
from tracer.proxy.upstream_errors import UpstreamFailure

SSE = (b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"hi\"}}]}\n\n"
       b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """(cert.pem, key.pem) for CN/SAN 127.0.0.1, self-signed."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class TlsUpstream:
    """A keep-alive HTTPS server on 127.0.0.1 in its own thread: each request gets one SSE
    completion, content-length framed."""

    def __init__(self, cert, key) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.requests: list[bytes] = []
        self.connections = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.context)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()

    async def _handle(self, reader, writer) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(SSE), SSE))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.transport.abort()

    def __enter__(self) -> TlsUpstream:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def _ask(upstream: Upstream) -> tuple[int, bytes]:
    async def go():
        exchange = upstream.exchange("POST", "/v1/chat/completions", b"", [], b"{}")
        try:
            head = await exchange.response_head()
            body = []
            while chunk := await exchange.read():
                body.append(chunk)
            return head.status, b"".join(body)
        finally:
            exchange.close()
    return go()


def test_a_self_signed_upstream_is_verified_with_the_ca_file(certificate):
    cert, key = certificate

    async def body(url):
        upstream = Upstream(url, ssl_context=upstream_tls_context(str(cert)))
        first = await asyncio.wait_for(_ask(upstream), 10)
        second = await asyncio.wait_for(_ask(upstream), 10)
        await upstream.aclose()
        return first, second

    with TlsUpstream(cert, key) as server:
        first, second = asyncio.run(body(server.url))
        assert first == second == (200, SSE)
        assert server.connections == 1          # kept alive over TLS
        assert len(server.requests) == 2


def test_without_the_ca_the_upstream_is_refused_not_trusted(certificate):
    cert, key = certificate

    async def body(url):
        upstream = Upstream(url, ssl_context=upstream_tls_context(None))
        try:
            with pytest.raises(UpstreamFailure) as info:
                await asyncio.wait_for(_ask(upstream), 10)
            return info.value
        finally:
            await upstream.aclose()

    with TlsUpstream(cert, key) as server:
        failure = asyncio.run(body(server.url))
        assert (failure.status, failure.error_type) == (502, "upstream_unavailable")
        assert "CERTIFICATE_VERIFY_FAILED" in failure.message
        assert server.requests == []


def test_the_proxy_relays_an_https_upstream_given_upstream_ca_file(certificate,
                                                                    proxy_factory):
    cert, key = certificate
    import argparse
    parser = argparse.ArgumentParser()
    add_proxy_arguments(parser)
    with TlsUpstream(cert, key) as server:
        args = parser.parse_args(["--upstream", server.url, "--upstream-ca-file", str(cert)])
        settings = settings_from_args(args)
        assert settings.upstream_ca_file == str(cert)
        proxy = proxy_factory(server.url, ("m",), upstream_ca_file=settings.upstream_ca_file,
                              upstream_metrics_path=None)
        response = httpx.post(proxy.base_url + "/v1/chat/completions", timeout=10,
                              json={"model": "m", "stream": True, "messages": []})
        assert response.status_code == 200 and response.content == SSE
        proxy.wait_idle()
        (record,) = proxy.parts.obs.store.recent(5)
        assert record.ttft_ns is not None and len(server.requests) == 1
