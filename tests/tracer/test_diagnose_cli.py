"""`python -m tracer diagnose` over a real `request_finished` log: the same ranking as
`/ui/api/diagnosis` over the same records, a table with the actions, and an exit status a
CI job can gate on."""
from __future__ import annotations

import io
import json
import subprocess
import sys

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.tracer.test_verdict import record
from tracer.core.diagnoser import Diagnoser
from tracer.diagnose.cli import EXIT_GATE, EXIT_INPUT, EXIT_OK
from tracer.sinks.logs import RequestLogSink, configure_logging
from tracer.sinks.store import TraceStore
from tracer.web.ui_api import make_ui_router


def judged_records(now_ns: int):
    """12 short healthy turns (the 2nd to the 8th not judged: too little history yet), then
    3 that queued and one long prompt, judged in order."""
    diagnoser = Diagnoser()
    out = []
    specs = [({}, 40)] * 12 + [({"queue": 3000.0}, 40)] * 3 + [({"prefill": 4000.0}, 3000)]
    for i, (stages, prompt) in enumerate(specs):
        rec = record(stages, prompt=prompt, trace=f"{i + 1:x}", start_ns=now_ns + i * 10**9)
        diagnoser.publish(rec)
        out.append(rec)
    return out


def write_log(records, path) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        sink = RequestLogSink(configure_logging("json", stream))
        for rec in records:
            sink.publish(rec)
        # Lines that are not ours are skipped, not fatal.
        stream.write("not json\n" + json.dumps({"event": "startup"}) + "\n")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracer", "diagnose", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_log_and_the_ui_rank_the_same(tmp_path):
    import time
    records = judged_records(time.perf_counter_ns() - 60 * 10**9)
    assert [r.verdict.cause for r in records[12:]] == ["queueing"] * 3 + ["long_prompt"]
    log = tmp_path / "requests.jsonl"
    write_log(records, log)
    cli = run_cli("--log", str(log), "--json", "--slo-ms", "2000")
    assert cli.returncode == EXIT_OK, cli.stderr
    from_log = json.loads(cli.stdout)

    store = TraceStore()
    for rec in records:
        store.put(rec)
    app = FastAPI()
    app.include_router(make_ui_router(store=store))
    from_ui = TestClient(app).get("/ui/api/diagnosis?minutes=60&slo_ms=2000").json()
    assert from_ui.pop("minutes") == 60
    assert from_ui.pop("to_unix_ms") is None and from_ui.pop("truncated") is False
    assert from_ui.pop("from_unix_ms") <= time.time() * 1000 - 60 * 60_000 + 5_000
    assert from_log == from_ui
    assert [c["cause"] for c in from_log["causes"]] == [
        "queueing", "long_prompt", "cold_path", "healthy", "unjudged"]
    assert {c["cause"]: c["num_requests"] for c in from_log["causes"]}["unjudged"] == 7
    queueing = from_log["causes"][0]
    assert queueing["num_requests"] == 3 and queueing["above_slo_s"] > 1.5
    assert len(queueing["slowest"]) == 3


def test_the_table_names_the_action_and_the_gate_exits_non_zero(tmp_path):
    import time
    log = tmp_path / "requests.jsonl"
    write_log(judged_records(time.perf_counter_ns()), log)
    table = run_cli("--log", str(log))
    assert table.returncode == EXIT_OK, table.stderr
    first_rows = table.stdout.splitlines()[2:4]
    assert first_rows[0].startswith("queueing")
    # Every request ran on our engine: its knob alone.
    assert first_rows[1] == "  -> raise --max-num-seqs (ttftscope engine)"
    gated = run_cli("--log", str(log), "--fail-above-s", "1")
    assert gated.returncode == EXIT_GATE and "queueing" in gated.stderr
    assert run_cli("--log", str(log), "--fail-above-s", "100").returncode == EXIT_OK
    assert run_cli("--log", str(log), "--fail-above-s", "1",
                   "--metric", "excess_s").returncode == EXIT_GATE


def test_a_missing_log_or_a_dead_server_is_an_input_error(tmp_path):
    missing = run_cli("--log", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == EXIT_INPUT and "nope.jsonl" in missing.stderr
    from tracer.diagnose.cli import add_diagnose_arguments, run_diagnose_command
    import argparse
    parser = argparse.ArgumentParser()
    add_diagnose_arguments(parser)
    err = io.StringIO()
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    args = parser.parse_args(["--url", "http://127.0.0.1:9"])
    assert run_diagnose_command(args, out=io.StringIO(), err=err) == EXIT_INPUT
    assert "127.0.0.1:9" in err.getvalue()


def test_since_and_until_pick_the_logs_window(tmp_path):
    import time
    records = judged_records(time.perf_counter_ns() - 60 * 10**9)
    log = tmp_path / "requests.jsonl"
    write_log(records, log)
    everything = json.loads(run_cli("--log", str(log), "--json").stdout)
    assert sum(c["num_requests"] for c in everything["causes"]) == len(records)
    future = json.loads(run_cli("--log", str(log), "--json", "--since", "1m", "--until",
                                str(int(time.time() * 1000) + 3_600_000)).stdout)
    past = json.loads(run_cli("--log", str(log), "--json", "--until", "1d").stdout)
    assert sum(c["num_requests"] for c in future["causes"]) == len(records)
    assert past["causes"] == [] or sum(c["num_requests"] for c in past["causes"]) == 0
    bad = run_cli("--log", str(log), "--since", "yesterday-ish")
    assert bad.returncode == EXIT_INPUT and "is not a time" in bad.stderr
