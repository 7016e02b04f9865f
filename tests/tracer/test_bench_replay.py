"""bench --replay without a server: the trace reader, the block prompts (measured on
SmolLM2's tokenizer), the length fields each server kind gets, the schedule's send lag
and the options a replay refuses."""
from __future__ import annotations

import asyncio
import json

import pytest

from tracer.__main__ import main
from tracer.bench import replay
from tracer.bench.mooncake import (
    TraceRequest,
    block_text,
    length_fields,
    load_trace,
    prompt_text,
    repeated_prefix_blocks,
)


def _trace(tmp_path, lines) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_load_trace_sorts_by_timestamp_and_validates(tmp_path):
    path = _trace(tmp_path, [
        {"timestamp": 30, "input_length": 20, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [0]}])
    assert [r.line for r in load_trace(path)] == [2, 1]
    for bad in ({"timestamp": -1, "input_length": 1, "output_length": 1},
                {"timestamp": 0, "input_length": 0, "output_length": 1},
                {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]},
                {"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [0, 1]},
                {"timestamp": 0, "text_input": "hi", "output_length": 1}):
        with pytest.raises(ValueError):
            load_trace(_trace(tmp_path, [bad]))


def test_same_hash_id_same_text_and_prefixes_shared():
    a = TraceRequest(1, 0, 40, 1, (7, 8, 9))
    b = TraceRequest(2, 0, 40, 1, (7, 8, 10))
    ta, tb = prompt_text(a), prompt_text(b)
    shared = block_text(7, 16) + block_text(8, 16)
    assert ta.startswith(shared) and tb.startswith(shared)
    assert ta[len(shared):] != tb[len(shared):]
    assert block_text(9, 8) == block_text(9, 16)[:len(block_text(9, 8))]  # a cut block
    assert len(prompt_text(TraceRequest(3, 0, 50, 1, (7,))).split()) == 50  # own words after
    assert repeated_prefix_blocks([a, b, TraceRequest(3, 0, 16, 1, (8,))]) == [0, 2, 1]


def test_blocks_are_block_size_tokens_on_smollm2():
    # Measured, not assumed: each block of 16 words is 16 tokens of the engine's tokenizer,
    # and blocks glued together tokenize as the blocks did (boundaries stay boundaries).
    gguf = pytest.importorskip("gguf")
    from instrumented_engine.model.loader import default_model_path
    from instrumented_engine.model.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(gguf.GGUFReader(str(default_model_path())))
    for h in range(300):
        assert len(tok.encode(block_text(h, 16), add_bos=None)) == 16
    request = TraceRequest(1, 0, 16 * 5 + 7, 1, (1, 2, 3, 4, 5, 6))
    ids = tok.encode(prompt_text(request), add_bos=None)
    assert len(ids) == request.input_length
    assert ids[:16] == tok.encode(block_text(1, 16), add_bos=None)


@pytest.mark.parametrize(("server", "fields"), [
    ("ttftscope", {"max_tokens": 9, "ignore_eos": True}),
    ("vllm", {"max_tokens": 9, "ignore_eos": True, "min_tokens": 9}),
    ("llama-server", {"max_tokens": 9, "ignore_eos": True}),
    ("openai", {"max_tokens": 9}),
])
def test_length_fields_per_server(server, fields):
    assert length_fields(server, "completions", 9) == fields


def test_schedule_keeps_absolute_deadlines(tmp_path, monkeypatch):
    # No server: each send returns at once, so the lag measured is the scheduler's own.
    path = _trace(tmp_path, [{"timestamp": t, "input_length": 4, "output_length": 1}
                             for t in (0, 0, 0, 5, 10, 10, 20, 40)])
    seen: list[int] = []

    async def fake_send(client, bench, index, body, headers):
        seen.append(bench.clock_ns())
        from tracer.bench.stats import RequestResult
        return RequestResult(index=index, sent_ns=seen[-1], finished_ns=seen[-1],
                             error_kind="connect_error")
    monkeypatch.setattr(replay, "send_request", fake_send)
    config = replay.ReplayConfig(trace_path=path, base_url="http://127.0.0.1:9", model="m")
    requests = load_trace(path)
    results, due_ns, _ = asyncio.run(replay._send_all(config, requests, [{}] * len(requests)))
    lags_ms = [(r.sent_ns - d) / 1e6 for r, d in zip(results, due_ns)]
    assert all(lag >= 0 for lag in lags_ms)
    assert [round((d - due_ns[0]) / 1e6) for d in due_ns] == [0, 0, 0, 5, 10, 10, 20, 40]
    print(f"idle scheduler send lag: max {max(lags_ms):.3f} ms")


@pytest.mark.parametrize("extra", [
    ["--concurrency", "4"], ["--num-requests", "3"], ["--output-tokens", "5"],
    ["--endpoint", "messages"], ["--time-scale", "0"],
])
def test_replay_refuses_options_it_would_ignore(tmp_path, extra, capsys):
    path = _trace(tmp_path, [{"timestamp": 0, "input_length": 4, "output_length": 1}])
    args = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--replay", path]
    assert main(args + extra) == 2
    assert "bench --replay:" in capsys.readouterr().err


def test_replay_options_without_replay_are_refused(capsys):
    args = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--num-requests", "1"]
    assert main(args + ["--time-scale", "2"]) == 2
    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--model", "m"]) == 2
