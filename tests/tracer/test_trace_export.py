"""`python -m tracer trace export`: Mooncake JSONL with the format's published fields
(docs/reference.md, "Trace export (Mooncake JSONL)"), prefixes shared as `hash_ids`, no
prompt text, and exit 2 with a message for bad input. The real engine's own test is
tests/tracer/test_trace_export_engine.py."""
from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys

import pytest

from tracer.core.export_fields import EngineBlocks, ExportFields
from tracer.record import block_chain
from tracer.record.clock import Clock
from tracer.record.request_record import RequestRecord
from tracer.sinks.logs import configure_logging, log_request
from tracer.trace.cli import add_trace_arguments, run_trace_command
from tracer.trace.export import EXIT_INPUT, EXIT_OK, mooncake_lines

SYSTEM = "You are the support assistant of a bank; answer in two sentences. " * 4
SECRET = "my account number is 4242-SECRET"
CLOCK = Clock(wall_ns=1_700_000_000_000_000_000, perf_ns=0)


def validate(lines: list[dict], block_size: int = 16) -> None:
    """The published fields (Mooncake's README, aiperf's MooncakeTrace model): exactly
    these four, ints and a list of ints, timestamps from 0 and never decreasing."""
    assert lines and lines[0]["timestamp"] == 0
    for before, line in zip([lines[0], *lines], lines):
        assert set(line) == {"timestamp", "input_length", "output_length", "hash_ids"}
        for key in ("timestamp", "input_length", "output_length"):
            assert type(line[key]) is int and line[key] >= 0, line
        assert type(line["hash_ids"]) is list
        assert all(type(i) is int and i >= 0 for i in line["hash_ids"])
        assert line["timestamp"] >= before["timestamp"]
        assert len(line["hash_ids"]) == math.ceil(line["input_length"] / block_size)


def record(i: int, *, source: str, prompt, tokens: int, start_ms: float) -> RequestRecord:
    start_ns = int(start_ms * 1e6)
    rec = RequestRecord(f"r{i}", f"{i:032x}", "2" * 16, "m", "chat", start_ns,
                        start_ns + 10**7, ttft_ns=10**6, num_prompt_tokens=tokens,
                        num_output_tokens=3 + i, source=source)
    if source == "proxy":
        rec.prompt_source = prompt
    else:
        rec.block_source = EngineBlocks([], prompt, 16)
    ExportFields(CLOCK).publish(rec)
    return rec


def proxy_records() -> list[RequestRecord]:
    bodies = [json.dumps({"model": "m", "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{SECRET} {q}" * 3}]
    }).encode() for q in ("why was my card declined?", "how do I close it?")]
    bodies.append(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "something else entirely " * 9}]}).encode())
    return [record(i, source="proxy", prompt=body, tokens=len(body) // 4, start_ms=5 + 7 * i)
            for i, body in enumerate(bodies)]


def log_file(tmp_path, records) -> str:
    buf = io.StringIO()
    logger = configure_logging("json", buf)
    buf.write("a line that is not ours\n")
    for rec in reversed(records):     # finish order differs from arrival order
        log_request(logger, rec)
    path = tmp_path / "server.log"
    path.write_text(buf.getvalue())
    return str(path)


def export(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = run_trace_command(parser.parse_args(["export", *argv]), out, err)
    return code, out.getvalue(), err.getvalue()


def test_a_proxy_log_exports_valid_lines_sharing_the_system_prompt_and_no_text(tmp_path):
    records = proxy_records()
    assert all(0 < len(r.block_chain) <= 8 * block_chain.MAX_BLOCKS for r in records)
    assert all(r.block_source is None for r in records)     # dropped once hashed
    path = log_file(tmp_path, records)
    code, out, err = export("--log", path)
    assert code == EXIT_OK, err
    assert "3 requests" in err
    lines = [json.loads(line) for line in out.splitlines()]
    validate(lines)
    assert [line["timestamp"] for line in lines] == [0, 7, 14]
    assert [line["input_length"] for line in lines] == [r.num_prompt_tokens for r in records]
    a, b, c = (line["hash_ids"] for line in lines)
    shared = len(SYSTEM) // block_chain.DEFAULT_CHARS_PER_BLOCK
    assert a[:shared] == b[:shared] and a[shared + 1:] != b[shared + 1:]
    assert not set(c) & set(a + b)
    assert SECRET not in out and "declined" not in out
    assert SECRET not in open(path).read()       # nor in the log the export reads


def test_engine_chains_share_leading_ids_and_block_size_merges_them(tmp_path):
    system = list(range(100, 164))                 # 4 blocks of 16 shared tokens
    prompts = [system + [7] * 40, system + [8] * 40, [9] * 70]
    records = [record(i, source="engine", prompt=p, tokens=len(p), start_ms=1 + i)
               for i, p in enumerate(prompts)]
    assert [len(r.block_chain) // 8 for r in records] == [6, 6, 4]
    path = log_file(tmp_path, records)
    lines = [json.loads(x) for x in export("--log", path)[1].splitlines()]
    validate(lines)
    a, b, c = (line["hash_ids"] for line in lines)
    assert a[:4] == b[:4] and a[4] != b[4] and len(set(a)) == len(a) == 7
    assert not set(c) & set(a + b)
    merged = [json.loads(x) for x in export("--log", path, "--block-size", "32")[1].splitlines()]
    validate(merged, 32)
    assert merged[0]["hash_ids"][:2] == merged[1]["hash_ids"][:2]
    assert merged[0]["hash_ids"][2] != merged[1]["hash_ids"][2]


def test_digests_are_keyed_per_process():
    """The same text hashed by another process gives other digests: no dictionary can be
    built offline to match a log line's chain."""
    here = block_chain.from_text(SYSTEM)
    code = ("from tracer.record import block_chain; import sys; "
            f"sys.stdout.write(block_chain.from_text({SYSTEM!r}).hex())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert len(here) == 8 * (len(SYSTEM) // 64) and bytes.fromhex(there) != here
    assert block_chain.from_text(SYSTEM) == here


def test_rows_without_tokens_are_left_out_and_counted():
    chain = block_chain.encode(block_chain.from_tokens(range(32)))
    rows = [{"arrival_unix_ms": 10, "prompt_tokens": 32, "output_tokens": 0,
             "prompt_blocks": chain},
            {"arrival_unix_ms": 20, "prompt_tokens": 0, "output_tokens": 4, "prompt_blocks": ""},
            {"arrival_unix_ms": 30, "prompt_tokens": 20, "output_tokens": 4, "prompt_blocks": ""}]
    lines, skipped = mooncake_lines(rows, 16)
    assert skipped == 2 and lines == [{"timestamp": 0, "input_length": 20, "output_length": 4,
                                       "hash_ids": [0, 1]}]


@pytest.mark.parametrize("argv, lines, message", [
    (["--log", "{missing}"], None, "No such file"),
    (["--log", "{log}"], ['{"event": "request_finished", "trace_id": "ab"'], "not JSON"),
    (["--log", "{log}"], ['{"event": "request_finished", "trace_id": "ab", "prompt_tokens": 3,'
                          ' "output_tokens": 1}'], "arrival_unix_ms is None"),
    (["--log", "{log}"], ['{"event": "request_finished", "arrival_unix_ms": 1, '
                          '"prompt_tokens": 3, "output_tokens": 1, "prompt_blocks": "@@"}'],
     "not base64"),
    (["--log", "{log}", "--with-text"], [], "--with-text"),
    (["--log", "{log}", "--minutes", "5"], [], "are for --url"),
    (["--url", "http://127.0.0.1:9"], None, "no answer"),
])
def test_bad_input_exits_2_with_a_message(tmp_path, argv, lines, message):
    log = tmp_path / "x.log"
    if lines is not None:
        log.write_text("\n".join(lines) + "\n")
    argv = [a.format(log=log, missing=tmp_path / "nope.log") for a in argv]
    code, out, err = export(*argv)
    assert code == EXIT_INPUT and out == "" and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["--log", "f", "--block-size", "20"], "multiple of 16"),
    (["--log", "f", "--block-size", "8"], "multiple of 16"),
    (["--url", "http://x", "--minutes", "0"], "outside 1 to"),
    ([], "one of the arguments --log --url is required"),
])
def test_bad_arguments_exit_2_from_the_command_line(argv, message):
    done = subprocess.run([sys.executable, "-m", "tracer", "trace", "export", *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
