"""`python -m tracer trace perfetto`: a saved timeline or a live server's window written as
Chrome Trace Event JSON, and exit 2 with a message for bad arguments, a dead server or an answer
that is not a timeline."""
from __future__ import annotations

import argparse
import io
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.tracer.test_chrome_trace import (
    TRACE_A, TRACE_B, of, request, step, timeline, validate)
from tracer.record.chrome_trace import FIRST_REQUEST_TID, REQUESTS_PID
from tracer.testing.fake_upstream import MODEL, FakeUpstream
from tracer.trace.cli import (
    EXIT_INPUT, EXIT_OK, add_trace_arguments, run_trace_command, unix_ms, window_params)


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracer", "trace", "perfetto", *args],
                          input=stdin, capture_output=True, text=True, timeout=60)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    return parser.parse_args(["perfetto", *argv])


def saved(tmp_path) -> str:
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(timeline(
        [request(TRACE_A, 10.0, [1, 12.5, 30]), request(TRACE_B, 20.0, [2, 3])],
        [step(23.5, 53.5, batch=["req-4bf9"])]) | {"num_more_requests": 3}))
    return str(path)


def test_a_saved_timeline_is_written_to_a_file_or_stdout(tmp_path):
    out = tmp_path / "window.json"
    written = run_cli("--in", saved(tmp_path), "-o", str(out))
    assert written.returncode == EXIT_OK, written.stderr
    assert written.stdout == ""
    assert "2 requests, 1 engine steps" in written.stderr and "3 more requests" in written.stderr
    events = validate(json.loads(out.read_text()))
    queue = [e for e in of(events, "X", REQUESTS_PID, FIRST_REQUEST_TID) if e["name"] == "queue"]
    assert queue[0]["dur"] == 12_500 and queue[0]["args"]["trace_id"] == TRACE_A
    piped = run_cli("--in", "-", stdin=(tmp_path / "timeline.json").read_text())
    assert piped.returncode == EXIT_OK and json.loads(piped.stdout) == json.loads(out.read_text())


@pytest.mark.parametrize("argv, message", [
    ([], "one of the arguments --url --in is required"),
    (["--url", "http://x", "--in", "f"], "not allowed with argument"),
    (["--url", "http://x", "--trace-id", "xyz"], "not a trace id"),
    (["--url", "http://x", "--trace-id", TRACE_A, "--pad-ms", "600001"], "outside 0 to 600,000"),
    (["--url", "http://x", "--from", "1700000000"], "seconds?"),
    (["--url", "http://x", "--from", "yesterday"], "neither unix ms nor an ISO-8601 time"),
])
def test_argument_errors_exit_2_with_a_message(argv, message):
    run = run_cli(*argv)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("argv, message", [
    (["--url", "http://x"], "give --trace-id ID, or both --from A and --to B"),
    (["--url", "http://x", "--from", "1700000000000"], "both --from A and --to B"),
    (["--url", "http://x", "--trace-id", TRACE_A, "--from", "1700000000000"], "not both"),
    (["--url", "http://x", "--from", "1700000000000", "--to", "1700000000000"], "after --from"),
    (["--url", "http://x", "--from", "2023-11-14T22:00:00Z", "--to", "2023-11-14T23:30:00Z"],
     "90 minutes"),
    (["--url", "http://x", "--from", "1700000000000", "--to", "1700000001000",
      "--pad-ms", "5"], "--pad-ms widens a --trace-id window"),
])
def test_an_incomplete_window_is_refused_before_any_request(argv, message):
    err = io.StringIO()
    assert run_trace_command(parse(*argv), out=io.StringIO(), err=err) == EXIT_INPUT
    assert message in err.getvalue() and err.getvalue().startswith("tracer trace perfetto: ")


def test_window_params_and_times():
    assert window_params(parse("--url", "u", "--trace-id", TRACE_A.upper())) == {
        "trace_id": TRACE_A, "pad_ms": 2000}
    assert window_params(parse("--url", "u", "--from", "2023-11-14T22:13:20+01:00",
                               "--to", "1699996400500")) == {
        "from_unix_ms": 1_699_996_400_000, "to_unix_ms": 1_699_996_400_500}
    assert unix_ms("2023-11-14T22:13:20.25") == 1_700_000_000_250


def test_in_refuses_the_live_window_arguments(tmp_path):
    run = run_cli("--in", saved(tmp_path), "--trace-id", TRACE_A)
    assert run.returncode == EXIT_INPUT and "--trace-id: for --url" in run.stderr


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"), ('{"requests": []}', "not a timeline"), ("[1]", "not a timeline")])
def test_a_file_that_is_not_a_timeline_exits_2(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    run = run_cli("--in", str(path))
    assert run.returncode == EXIT_INPUT and message in run.stderr and run.stdout == ""
    missing = run_cli("--in", str(tmp_path / "nope.json"))
    assert missing.returncode == EXIT_INPUT and "nope.json" in missing.stderr


def test_a_dead_server_exits_2_naming_it():
    err = io.StringIO()
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    args = parse("--url", "http://127.0.0.1:9", "--trace-id", TRACE_A)
    assert run_trace_command(args, out=io.StringIO(), err=err) == EXIT_INPUT
    assert "http://127.0.0.1:9: no answer" in err.getvalue()
    bad = parse("--url", "not a url at all", "--trace-id", TRACE_A)
    assert run_trace_command(bad, out=io.StringIO(), err=io.StringIO()) == EXIT_INPUT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _poll(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _traced_ids(base_url: str) -> set[str]:
    try:
        rows = httpx.get(base_url + "/ui/api/requests", timeout=2).json()["requests"]
    except (httpx.HTTPError, ValueError, KeyError):
        return set()
    return {row["trace_id"] for row in rows}


def test_a_live_proxy_window_holds_both_requests_tracks(tmp_path):
    """The real commands: `tracer proxy` in front of the fake upstream, two streamed requests
    with our trace ids, then `tracer trace perfetto --url --trace-id`."""
    upstream = FakeUpstream(chunks=6, gap_ms=0).start()
    base_url = f"http://127.0.0.1:{_free_port()}"
    log = (tmp_path / "proxy.log").open("w")
    proxy = subprocess.Popen([sys.executable, "-m", "tracer", "proxy", "--upstream",
                              upstream.base_url, "--listen", base_url.removeprefix("http://")],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        assert _poll(lambda: proxy.poll() is not None or _healthy(base_url))
        assert proxy.poll() is None, (tmp_path / "proxy.log").read_text()
        for trace in (TRACE_A, TRACE_B):
            with httpx.stream("POST", base_url + "/v1/chat/completions",
                              headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
                              json={"model": MODEL, "stream": True, "messages": []},
                              timeout=30) as response:
                assert response.status_code == 200
                response.read()
        assert _poll(lambda: _traced_ids(base_url) >= {TRACE_A, TRACE_B})
        out = tmp_path / "window.json"
        run = run_cli("--url", base_url, "--trace-id", TRACE_A, "--pad-ms", "60000",
                      "-o", str(out))
        assert run.returncode == EXIT_OK, run.stderr
        assert "2 requests, 0 engine steps" in run.stderr
        events = validate(json.loads(out.read_text()))
        tracks = {e["args"]["name"]: e["tid"] for e in of(events, "M", REQUESTS_PID)
                  if e["name"] == "thread_name"}
        assert {name[:12] for name in tracks} == {"req 4bf92f35", "req 00f067aa"}
        traced = {e["args"]["trace_id"]: e["tid"] for e in of(events, "X", REQUESTS_PID)
                  if e["name"] == "request"}
        assert set(traced) == {TRACE_A, TRACE_B} and len(set(traced.values())) == 2
        assert {e["pid"] for e in events} == {REQUESTS_PID}        # a proxy: no engine track
        unknown = run_cli("--url", base_url, "--trace-id", "f" * 32)
        assert unknown.returncode == EXIT_INPUT and "answered 404" in unknown.stderr
    finally:
        proxy.terminate()
        assert proxy.wait(timeout=30) is not None
        upstream.stop()
