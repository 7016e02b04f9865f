"""The trace export against the real engine: its prefix cache's block hashes become
`hash_ids` (one per 16 tokens, ceil(input_length / 16) of them), requests sharing a system
prompt share their leading ids and the cache hits fall within them, and `--url` and
`--log` give the same lines (docs/reference.md, "Trace export (Mooncake JSONL)")."""
from __future__ import annotations

import io
import json

import httpx
import pytest

from tests.tracer.test_trace_export import export, validate
from tracer.sinks.logs import configure_logging, log_request

SYSTEM = ("You are the support assistant of a small bank. Answer politely, in two short "
          "sentences, and never ask for a password or a card number. ") * 2
QUESTIONS = ["Why was my card declined yesterday?", "How do I close my savings account?",
             "Can I raise my daily limit?"]
SECRET = "zebra-7731"


def ask(base_url: str, model: str, messages: list[dict]) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("caching", [True, False])
def test_engine_export_shares_the_system_prompt_blocks_and_url_equals_log(
        server_factory, tmp_path, caching):
    live = server_factory(enable_prefix_caching=caching)
    for question in QUESTIONS:
        ask(live.base_url, live.model, [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": f"{question} {SECRET}"}])
    ask(live.base_url, live.model, [{"role": "user", "content": "Tell me a joke " * 6}])
    live.wait_idle()
    assert live.parts.obs.tracer.drain(30)
    records = sorted(live.parts.obs.store.recent(100), key=lambda r: r.start_ns)
    assert len(records) == 4
    for rec in records:     # one 8-byte digest per full 16-token block of the prompt
        assert len(rec.block_chain) == 8 * (rec.num_prompt_tokens // 16)
        assert rec.arrival_unix_ms is not None and rec.block_source is None

    code, out, err = export("--url", live.base_url, "--minutes", "5")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    validate(lines)
    assert [line["input_length"] for line in lines] == [r.num_prompt_tokens for r in records]
    assert [line["output_length"] for line in lines] == [r.num_output_tokens for r in records]

    first, *others, joke = [line["hash_ids"] for line in lines]
    for ids, rec in zip(others, records[1:]):
        n = shared_prefix(first, ids)
        assert n >= 4 and ids[n:] and not set(ids[n:]) & set(first)
        # Cache hits only where hash_ids repeat: the hit is within the shared blocks.
        assert rec.num_cached_tokens <= 16 * n
        assert (rec.num_cached_tokens > 0) is caching
    assert not set(joke) & set(first + [i for ids in others for i in ids])
    assert SECRET not in out and "declined" not in out

    buf = io.StringIO()
    logger = configure_logging("json", buf)
    for rec in reversed(records):       # the log sink's own function, in finish order
        log_request(logger, rec)
    assert SECRET not in buf.getvalue()
    path = tmp_path / "engine.log"
    path.write_text(buf.getvalue())
    code, from_log, err = export("--log", str(path))
    assert code == 0, err
    assert from_log == out
