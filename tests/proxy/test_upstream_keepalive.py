"""The upstream connection outlives the request it served: after a whole response the proxy
keeps it for the next request, as nginx's `keepalive` upstream pool does, and lets it go
only when a client leaves before the upstream's response has ended."""
from __future__ import annotations

import httpx
import pytest

from proxy_support import wait_until
from tracer.testing.fake_upstream import MODEL

STREAM = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("stream", [True, False])
def test_one_upstream_connection_serves_requests_in_turn(proxy_factory, fake_upstream, stream):
    proxy = proxy_factory(fake_upstream.base_url)
    with httpx.Client(timeout=10) as client:
        for _ in range(4):
            response = client.post(proxy.base_url + "/v1/chat/completions",
                                   json={**STREAM, "stream": stream})
            assert response.status_code == 200 and b"content" in response.content
            # The client's disconnect notice (uvicorn's receive, once the response is
            # complete) must not reset the connection the upstream answered on.
            assert wait_until(lambda: proxy.parts.upstream.pool_state() == (1, 0))
    assert len(fake_upstream.state.requests) == 4
    assert fake_upstream.state.num_disconnects_while_busy == 0
    assert fake_upstream.state.num_open_connections == 1


def test_a_client_gone_mid_stream_still_lets_the_upstream_go(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", proxy.base_url + "/v1/chat/completions", json=STREAM,
                           headers={"x-fake-mode": "hold"}) as response:
            next(response.iter_bytes())
    assert fake_upstream.state.disconnected_while_busy.wait(5)
    assert wait_until(lambda: proxy.parts.upstream.pool_state() == (0, 0))
