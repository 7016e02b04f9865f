"""The proxy's request path makes no call that hands the GIL away (tracer/record/ids.py):
no OS randomness for ids, no one-shot HMAC for the in-band line, on the serving thread or
the record worker."""
from __future__ import annotations

import httpx

from tracer.testing.fake_upstream import MODEL
from tracer.testing.gil_release import forbid_gil_release

STREAM = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _stream(proxy) -> str:
    with httpx.stream("POST", proxy.base_url + "/v1/chat/completions", json=STREAM,
                      headers={"x-ttft-timing": "1", "traceparent":
                               "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                      timeout=30) as response:
        assert response.status_code == 200
        return response.read().decode()


def test_a_traced_timed_request_hands_the_gil_to_nobody(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    _stream(proxy)   # warm: imports, the upstream connection, the worker thread
    proxy.wait_idle()
    with forbid_gil_release() as seen:
        bodies = [_stream(proxy) for _ in range(5)]
        proxy.wait_idle()
        assert proxy.parts.obs.tracer.drain(30)   # the sinks ran under the guard too
    assert seen == []
    assert all(": ttft-timing " in body for body in bodies)
    assert len(proxy.parts.obs.store.recent(10)) == 6


def test_the_guard_catches_what_it_guards():
    import hmac
    import uuid
    with forbid_gil_release() as seen:
        for call in (uuid.uuid4, lambda: hmac.digest(b"k", b"m", "sha256")):
            try:
                call()
            except RuntimeError:
                pass
    assert len(seen) == 2
