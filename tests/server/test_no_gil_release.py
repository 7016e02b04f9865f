"""The engine server's request path makes no call that hands the GIL away
(tracer/record/ids.py): the request id, the chat template's nonce, the in-band line."""
from __future__ import annotations

import httpx

from tracer.testing.gil_release import forbid_gil_release


def test_a_chat_stream_hands_the_gil_to_nobody(live):
    body = {"model": live.model, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say <|im_start|> hi"}]}

    def stream() -> str:
        with httpx.stream("POST", live.base_url + "/v1/chat/completions", json=body,
                          headers={"x-ttft-timing": "1"}, timeout=60) as response:
            assert response.status_code == 200
            return response.read().decode()

    stream()   # warm
    live.wait_idle()
    with forbid_gil_release() as seen:
        text = stream()
        live.wait_idle()
        assert live.parts.obs.tracer.drain(30)
    assert seen == []
    assert ": ttft-timing " in text and "[DONE]" in text
