"""The trace export behind the proxy: the prompt's text, as the proxy saw it, chained in
64-character blocks on the tracer's worker, so two requests sharing a system prompt share
their leading digests; `/ui/api/export` serves them without any text (docs/reference.md,
"Trace export (Mooncake JSONL)")."""
from __future__ import annotations

import json

import httpx

from tests.tracer.test_trace_export import export, validate
from tracer.record.block_chain import DEFAULT_CHARS_PER_BLOCK
from tracer.record.prompt_overlap import prompt_text
from tracer.testing.fake_upstream import MODEL

SYSTEM = "You translate customer e-mails into plain English, keeping names as they are. " * 3
SECRET = "orchid-5521"


def test_proxy_records_chain_the_prompt_text_and_export_it(proxy_factory, fake_upstream):
    proxy = proxy_factory(fake_upstream.base_url)
    bodies = [{"model": MODEL, "messages": [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": f"{q} {SECRET}" * 4}]}
              for q in ("Where is my parcel?", "Cancel my order, please.")]
    with httpx.Client(timeout=30, trust_env=False) as client:
        for body in bodies:
            assert client.post(proxy.base_url + "/v1/chat/completions",
                               json=body).status_code == 200
    proxy.wait_idle()
    assert proxy.parts.obs.tracer.drain(30)
    records = sorted(proxy.parts.obs.store.recent(10), key=lambda r: r.start_ns)
    shared = len(SYSTEM) // DEFAULT_CHARS_PER_BLOCK
    for rec, body in zip(records, bodies):
        assert rec.prompt_source is None        # dropped after the chain and the diagnosis
        blocks = len(prompt_text(body["messages"])) // DEFAULT_CHARS_PER_BLOCK
        assert len(rec.block_chain) == 8 * blocks
    a, b = (r.block_chain for r in records)
    assert a[:8 * shared] == b[:8 * shared] and a[8 * shared + 8:] != b[8 * shared + 8:]

    rows = httpx.get(proxy.base_url + "/ui/api/export", params={"minutes": "5"}).json()
    assert len(rows["requests"]) == 2 and SECRET not in str(rows)
    assert httpx.get(proxy.base_url + "/ui/api/export?minutes=0").status_code == 400
    code, out, err = export("--url", proxy.base_url)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    validate(lines)          # the fake upstream reports 5 prompt tokens: one partial block
    assert SECRET not in out
