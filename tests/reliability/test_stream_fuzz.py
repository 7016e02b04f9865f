"""Every stream format the proxy parses, fuzzed with Hypothesis as a hostile upstream (issue
39, "Deliver"): a proxy on loopback in front of an upstream whose answer Hypothesis writes
(chat completions, completions, Anthropic messages, Responses; streamed and whole; valid and
mutated: CR / LF / CRLF, comments, `id:` / `retry:`, byte order marks, random read cuts,
lines at the scanner's 1 MiB bound, deep JSON, wrong types, 1e400, lone surrogates, no end
event, early close, upstream error statuses), while a bystander streams through the same
proxy. For each input: the client gets the upstream's bytes, except what docs/reference.md,
"The in-band timing line" allows and the error event of a cut stream; no 5xx of the proxy's
own; the record is published with a bounded finish reason and a known error type; no join
slot, upstream connection or task is left; no sink fails. The numbers go to
docs/reference.md, "Stream format fuzz"."""
from __future__ import annotations

import itertools
import os
import re
import resource
import statistics
import sys
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "proxy"))
from proxy_support import start_proxy, wait_until  # noqa: E402
from stream_fuzz_support import NORMAL, PATHS, HostileUpstream, scenarios  # noqa: E402
from tracer.record.errors import PROXY_ERROR_TYPES  # noqa: E402
from tracer.record.stages import FINISH_REASONS  # noqa: E402
from tracer.testing.fake_upstream import MODEL  # noqa: E402

EXAMPLES = int(os.environ.get("STREAM_FUZZ_EXAMPLES", 100))   # per format
_OURS = re.compile(rb"(?:(?<=[\r\n])|\A): ttft-timing [A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\n\n")
_THEIRS = re.compile(rb"(?:(?<=[\r\n])|\A):[ ]?ttft-timing[^\r\n]*(?:\r\n|\r|\n)?")
_CUT_EVENT = re.compile(rb'(?:\n\n)?data: \{"error": \{"message": "[^\n]*", "type": '
                        rb'"upstream_error", "param": null, "code": "(?:upstream_stream_cut|'
                        rb'upstream_timeout)"\}\}\n\n\Z')
_REQUESTS = {"chat": {"messages": [{"role": "user", "content": "hi"}]},
             "completions": {"prompt": "hi"}, "responses": {"input": "hi"},
             "anthropic": {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}}
TALLY: dict[str, int] = {}


def _done_event_start(stream: bytes) -> int | None:
    """Where the first event starting with a `data: [DONE]` line begins (SSE framing)."""
    at, event_start = 0, True
    for m in re.finditer(rb"[^\r\n]*(?:\r\n|\r|\n)", stream):
        if event_start and re.match(rb"data: ?\[DONE\]", m[0]):
            return m.start()
        event_start, at = m[0] in (b"\n", b"\r", b"\r\n"), m.end()
    return at if event_start and re.match(rb"data: ?\[DONE\]", stream[at:]) else None


class Bystander:
    """A normal streamed request through the same proxy, again and again, while the fuzz runs."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.stop, self.latencies = base_url, threading.Event(), []
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                start = time.perf_counter()
                r = client.post(self.base_url + "/v1/chat/completions", json={
                    "model": MODEL, "stream": True, **_REQUESTS["chat"]})
                self.latencies.append(time.perf_counter() - start)
                if r.status_code != 200 or r.content != NORMAL:
                    self.failures.append(f"{r.status_code} {r.content[:200]!r}")
                self.stop.wait(0.02)


class Rss:
    """Peak resident memory of this process (the proxy runs in it) while a block runs."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.idle = self.peak = self._now()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _now() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self._now())
            self.stop.wait(0.005)


@pytest.fixture(scope="module")
def rig():
    with HostileUpstream() as upstream:
        proxy = start_proxy(upstream.base_url, (MODEL,))
        yield upstream, proxy
        proxy.app.stop()


def _exchange(client, proxy, upstream, fmt, scenario, key, inband):
    upstream.scenarios[key] = scenario
    headers = {"x-fuzz-id": key, **({"x-ttft-timing": "1"} if inband else {})}
    body = {"model": MODEL, "stream": scenario.ctype.startswith(b"text/event-stream"),
            **_REQUESTS[fmt]}
    received, broken = [], False
    with client.stream("POST", proxy.base_url + PATHS[fmt], json=body, headers=headers) as r:
        try:
            for data in r.iter_raw():
                received.append(data)
        except httpx.HTTPError:
            broken = True
    return r, b"".join(received), broken


def _check_bytes(scenario, got: bytes, broken: bool, inband: bool) -> bool:
    """The client's bytes against the upstream's; True when the proxy added its error event."""
    sent = scenario.sent
    if not scenario.ctype.startswith(b"text/event-stream"):
        assert got == sent and broken == (scenario.cut is not None), (got[:300], sent[:300])
        return False
    assert not broken
    relayed = _THEIRS.sub(b"", sent) if inband else sent
    if inband:
        ours = list(_OURS.finditer(got))
        assert len(ours) <= 1, got[-600:]
        if ours:
            line = ours[0]
            done_at = _done_event_start(relayed)
            assert line.start() == (len(relayed) if done_at is None else done_at), \
                (line.start(), done_at, len(relayed), got[-300:])
            got = got[:line.start()] + got[line.end():]
            TALLY["inband_lines"] = TALLY.get("inband_lines", 0) + 1
    cut_event = _CUT_EVENT.search(got)
    if cut_event is not None:   # its blank line first, when the stream broke mid-event
        starts = {cut_event.start(), cut_event.start() + 2 * cut_event[0].startswith(b"\n\n")}
        if relayed in (got[:at] for at in starts):
            return True
    if got != relayed and os.environ.get("STREAM_FUZZ_DUMP"):
        with open(os.environ["STREAM_FUZZ_DUMP"], "w") as out:
            out.write(repr((inband, scenario, got)))
    assert got == relayed, (len(got), len(relayed), got[-300:], relayed[-300:])
    return False


def _check_record(proxy, request_id, scenario, cut_event: bool) -> None:
    store = proxy.parts.obs.store
    assert wait_until(lambda: store.get_by_request_id(request_id) is not None, 20), request_id
    record = store.get_by_request_id(request_id)
    reason, error = record.finish_reason, record.error_type
    label = f"outcome {reason if reason in FINISH_REASONS else 'other'}/{error}"
    TALLY[label] = TALLY.get(label, 0) + 1
    assert isinstance(reason, str) and 0 < len(reason) <= 32 and reason != "abort"
    assert error is None or error in PROXY_ERROR_TYPES
    if cut_event:
        assert (reason, error) in {("error", "upstream"), ("error", "timeout")}
    if scenario.status >= 500 and scenario.cut is None and not cut_event:
        assert (reason, error) == ("error", "upstream_status")
    if scenario.clean:
        assert (reason, error) == (scenario.finish, None)
        assert record.ttft_ns is not None


def _no_leak(proxy, upstream, tasks_before: int) -> None:
    proxy.wait_idle(20)
    join = proxy.parts.join
    assert join is None or (join.num_expected == 0 and join.num_pending == 0)
    assert wait_until(lambda: proxy.parts.upstream.pool_state()[1] == 0, 20)
    assert proxy.parts.upstream.pool_state()[0] <= 4 and upstream.open_connections <= 4
    assert proxy.parts.obs.tracer.sink_failures == {}
    assert proxy.app.num_tasks() <= tasks_before + 4


_ids = itertools.count()


def _fuzz(rig, fmt: str):
    upstream, proxy = rig
    tasks_before = proxy.app.num_tasks()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scenario=scenarios(fmt), inband=st.booleans())
    def one(scenario, inband) -> None:
        key = f"f{next(_ids)}"
        with httpx.Client(timeout=60) as client:
            response, got, broken = _exchange(client, proxy, upstream, fmt, scenario, key,
                                              inband)
        TALLY[fmt] = TALLY.get(fmt, 0) + 1
        TALLY["5xx"] = TALLY.get("5xx", 0) + (response.status_code >= 500
                                              and response.status_code != scenario.status)
        assert response.status_code == scenario.status, (response.status_code, got[:300])
        cut_event = _check_bytes(scenario, got, broken, inband)
        _check_record(proxy, response.headers["x-request-id"], scenario, cut_event)
        _no_leak(proxy, upstream, tasks_before)
    one()


# The proxy's and the bystander's threads use `random` while Hypothesis draws.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_fuzz_every_stream_format_as_a_hostile_upstream(rig):
    upstream, proxy = rig
    bystander, rss, started = Bystander(proxy.base_url), Rss(), time.monotonic()
    bystander.thread.start()
    rss.thread.start()
    try:
        for fmt in PATHS:
            _fuzz(rig, fmt)
    finally:
        bystander.stop.set()
        rss.stop.set()
        bystander.thread.join(60)
        rss.thread.join(10)
    lat = sorted(bystander.latencies)
    print(f"\nstream fuzz: {', '.join(f'{f} {TALLY.get(f, 0)}' for f in PATHS)} inputs in "
          f"{time.monotonic() - started:.0f} s; {TALLY.get('5xx', 0)} 5xx of the proxy's "
          f"own; {TALLY.get('inband_lines', 0)} timing lines checked; RSS idle "
          f"{rss.idle / 2**20:.0f} MiB, peak +{(rss.peak - rss.idle) / 2**20:.0f} MiB "
          f"(ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB); "
          f"bystander {len(lat)} streams, median {statistics.median(lat) * 1e3:.1f} ms, "
          f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.1f} ms, worst {lat[-1] * 1e3:.1f} ms")
    print("outcomes: " + ", ".join(f"{k[8:]} {v}" for k, v in sorted(TALLY.items())
                                    if k.startswith("outcome ")))
    assert not bystander.failures, bystander.failures[:3]
    labels = {s.labels.get("finish_reason") for m in proxy.parts.obs.registry.collect()
              if m.name == "llm_requests" for s in m.samples}
    assert labels - {None} <= set(FINISH_REASONS) | {"other"}, labels
