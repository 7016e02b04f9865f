"""Beacons joined to the server's trace: the store, client metrics and client spans.

A beacon joins the local record of its trace (the in-process join, which also enriches
/ui) or, when this process did not serve the request, the signed in-band timing it carries
(tracer/web/inband.py). The HTTP side, with its refusals, is `endpoint.py`.
"""
from __future__ import annotations

import heapq
import logging
import threading

from tracer.record.causes import CLIENT_CAUSES
from tracer.record.request_record import RequestRecord
from tracer.web.inband import InbandTiming
from tracer.web.probe.alignment import (
    ClientStage,
    ClockAlignment,
    align,
    align_inband,
    place_client_stages,
)
from tracer.web.probe.beacon import Beacon
from tracer.web.probe.beacon_fields import MAX_MILESTONE_MS
from tracer.web.probe.buffering import BufferingVerdict, detect_buffering
from tracer.web.probe.client_phases import chunk_gaps_ms, client_stage_ms

_log = logging.getLogger(__name__)
# An in-band token is fresh from its request's receive start until the beacon's own end of
# the stream (`t.end`) plus this grace: the probe's one-hour rule for its milestones (a tab
# that sends an hour late has nothing to measure either).
TOKEN_GRACE_NS = int(MAX_MILESTONE_MS * 1e6)
# How far ahead of ours the signing process's clock may be (NTP keeps hosts within ms).
TOKEN_MAX_AHEAD_NS = 5_000_000_000
# Trace ids remembered so that a beacon joined from its signed payload (no local record) is
# counted once; the default per process.
MAX_REMOTE_JOINS = 10_000


def stale_token_error(server: InbandTiming, beacon: Beacon, now_unix_ns: int) -> str | None:
    """Why `server` (a checked in-band timing) is too old or from the future for `beacon`,
    or None. Signed is not enough: without a bound, a token saved today replays next week.

    >>> from tracer.web.probe.schema import parse_beacon
    >>> b = parse_beacon(b'{"v":1,"outcome":"ok","t":{"start":0,"end":5}}')
    >>> t = InbandTiming("ab" * 16, "cd" * 8, "proxy", "m", 10**18, 0.5, None)
    >>> stale_token_error(t, b, 10**18 + 10**9) is None
    True
    >>> stale_token_error(t, b, 10**18 + 2 * TOKEN_GRACE_NS)[:32]
    'the server token is older than t'
    >>> stale_token_error(t, b, 10**18 - 2 * TOKEN_MAX_AHEAD_NS)[:32]
    'the server token is from the fut'
    """
    age_ns = now_unix_ns - server.recv_unix_ns
    if age_ns < -TOKEN_MAX_AHEAD_NS:
        return (f"the server token is from the future ({-age_ns / 1e9:.0f} s ahead of this "
                "server's clock)")
    if age_ns > int(beacon.t.end * 1e6) + TOKEN_GRACE_NS:
        return ("the server token is older than the beacon's stream plus "
                f"{MAX_MILESTONE_MS / 3.6e6:g} h: a replay, or a beacon sent far too late")
    return None


class ProbeIngestor:
    """Joins checked beacons to server records: store, client metrics, client spans.

    >>> from tracer.sinks.store import TraceStore
    >>> from tracer.web.probe.schema import parse_beacon
    >>> ingestor = ProbeIngestor(store=TraceStore())
    >>> beacon = parse_beacon(b'{"v":1,"trace_id":"' + b"1" * 32 + b'","outcome":"ok","t":{"start":0,"end":5}}')
    >>> ingestor.ingest(beacon)     # no server record with that trace id
    'unmatched'
    """

    def __init__(self, *, store, metrics=None, span_builder=None, diagnoser=None,
                 max_remote_joins: int = MAX_REMOTE_JOINS) -> None:
        self.store = store
        self.metrics = metrics
        # tracer.core.diagnoser.Diagnoser: the beacon's half of the TTFT verdict
        self.diagnoser = diagnoser
        self._spans = span_builder
        # Trace ids joined from in-band timing (no local record), with their requests'
        # receive starts, oldest request first: the first beacon of a trace wins here too,
        # in bounded memory.
        self._remote_joined: set[str] = set()
        self._by_age: list[tuple[int, str]] = []   # a heap of (recv_unix_ns, trace_id)
        self._max_remote_joins = max_remote_joins
        # The bound forgets the oldest requests first and remembers up to when: a token
        # from then or before may be one forgotten, so it is refused. A replay cannot
        # outlive the memory of it; the price is the beacon of a request that started
        # before the `max_remote_joins` newest joined ones (a stream longer than that many
        # beacons' worth of traffic).
        self._forgotten_until_ns = 0
        self._lock = threading.Lock()

    def ingest(self, beacon: Beacon, server: InbandTiming | None = None) -> str:
        """"accepted" once joined; "unmatched" when no un-joined record has the trace id (the
        first beacon of a request wins, so a replay cannot overwrite or double-count it).

        `server` is the beacon's checked in-band timing: with no local record (another
        replica served the request, or this is a standalone collector) the beacon is joined
        from it alone: client TTFT, network + gateway time, buffering, the client spans. A
        local record, when there is one, is still joined for /ui."""
        trace_id = server.trace_id if server is not None else beacon.trace_id
        if trace_id is None:
            return "unmatched"
        record = self.store.get_local(trace_id)   # on the event loop: no database read
        if record is None:
            return "unmatched" if server is None else self._ingest_remote(beacon, server)
        if record.client is not None:
            return "unmatched"
        alignment = align(record, beacon.t)
        stages = () if alignment is None else place_client_stages(beacon.t, alignment)
        verdict = detect_buffering(server.send_ms if server is not None
                                   else record_send_ms(record), beacon.chunk_ms)
        view = client_view(record, beacon, alignment, stages, verdict)
        if self.store.attach_client(trace_id, view) is not record:
            return "unmatched"  # evicted (or replaced) between the lookup and the join
        self._observe(record.model, view, beacon, trace_id, verdict)
        self._judge(record, view)
        self.store.persist(record)   # the joined beacon and verdict reach the database too
        if self._spans is not None and alignment is not None:
            try:
                emit_client_spans(self._spans, record, beacon, alignment, stages, verdict)
            except Exception:  # a span sink must never fail the beacon
                _log.exception("ttftscope: emitting client spans failed")
        return "accepted"

    def _ingest_remote(self, beacon: Beacon, server: InbandTiming) -> str:
        with self._lock:
            if (server.trace_id in self._remote_joined
                    or server.recv_unix_ns <= self._forgotten_until_ns):
                return "unmatched"
            self._remote_joined.add(server.trace_id)
            heapq.heappush(self._by_age, (server.recv_unix_ns, server.trace_id))
            if len(self._remote_joined) > self._max_remote_joins:
                recv_ns, oldest = heapq.heappop(self._by_age)
                self._remote_joined.discard(oldest)
                self._forgotten_until_ns = max(self._forgotten_until_ns, recv_ns)
        alignment = align_inband(server, beacon.t)
        stages = () if alignment is None else place_client_stages(beacon.t, alignment)
        verdict = detect_buffering(server.send_ms, beacon.chunk_ms)
        view = joined_numbers(beacon, server.ttft_ms)
        self._observe(server.model, view, beacon, server.trace_id, verdict)
        if self._spans is not None and alignment is not None:
            try:
                emit_joined_client_spans(
                    self._spans, server.trace_id, server.span_id, beacon, alignment, stages,
                    verdict, {"llm.client.join": "inband", "llm.server.source": server.source},
                    epoch=True)
            except Exception:  # a span sink must never fail the beacon
                _log.exception("ttftscope: emitting client spans failed")
        return "accepted"

    def _judge(self, record: RequestRecord, view: dict) -> None:
        """The verdict with the browser's side; counted again only when that side (network,
        buffering) became the cause: the server's verdict was counted when it finished."""
        if self.diagnoser is None:
            return
        joined = self.diagnoser.join_client(record, view)
        if joined is not None and joined.cause in CLIENT_CAUSES and self.metrics is not None:
            self.metrics.observe_verdict(record.model, joined)

    def _observe(self, model: str, view: dict, beacon: Beacon, trace_id: str,
                 verdict: BufferingVerdict | None) -> None:
        if self.metrics is not None:
            observe_client_view(self.metrics, model, view, beacon, trace_id, verdict)

    @property
    def num_remote_joins(self) -> int:
        """Trace ids remembered from in-band joins (bounded by `max_remote_joins`)."""
        return len(self._remote_joined)


def record_send_ms(record: RequestRecord) -> list[float]:
    """The send offsets (ms after receive start) of a record's first content events, rebuilt
    from its TTFT and inter-token gaps: the server side of the buffering check in-process.

    >>> r = RequestRecord("r", "1" * 32, "1" * 16, "m", "chat", 0, 1)
    >>> from tracer.record.emits import GapSummary
    >>> r.ttft_ns, r.itl = 4_000_000, GapSummary.of((1_000_000, 2_500_000))
    >>> record_send_ms(r)
    [4.0, 5.0, 7.5]
    """
    if record.ttft_ns is None:
        return []
    out, t_ns = [record.ttft_ns / 1e6], record.ttft_ns
    for gap_ns in record.itl.first_ns:
        t_ns += gap_ns
        out.append(t_ns / 1e6)
    return out


def observe_client_view(metrics, model: str, view: dict, beacon: Beacon, trace_id: str,
                        verdict: BufferingVerdict | None = None) -> None:
    """A joined beacon's client metrics: `view` holds `joined_numbers`."""
    metrics.observe_client(model, _s(view["client_ttft_ms"]), _s(view["network_overhead_ms"]),
                           _s(view["render_delay_ms"]), trace_id,
                           stages_s={k: v / 1e3 for k, v in client_stage_ms(beacon).items()},
                           itl_s=[g / 1e3 for g in chunk_gaps_ms(beacon)])
    if verdict is not None:
        metrics.observe_buffering(model, verdict.buffered, verdict.held_back_ms / 1e3, trace_id)


def emit_client_spans(span_builder, record: RequestRecord, beacon: Beacon,
                      alignment: ClockAlignment, stages: tuple[ClientStage, ...],
                      verdict: BufferingVerdict | None = None) -> None:
    """The beacon's spans, placed on the server's axis, through the span sink's public API."""
    emit_joined_client_spans(span_builder, record.trace_id, record.span_id, beacon, alignment,
                             stages, verdict, {"llm.request_id": record.request_id})


def emit_joined_client_spans(span_builder, trace_id: str, server_span_id: str, beacon: Beacon,
                             alignment: ClockAlignment, stages: tuple[ClientStage, ...],
                             verdict: BufferingVerdict | None, extra: dict, *,
                             epoch: bool = False) -> None:
    """The beacon's spans under `server_span_id`; `epoch`: `alignment` maps to Unix ns."""
    clock = {"llm.client.clock_skew_ms": alignment.offset_ns / 1e6,
             "llm.client.clock_uncertainty_ms": alignment.uncertainty_ns / 1e6,
             "llm.client.clock_anchor": alignment.anchor}
    attrs = {**clock, "llm.client.outcome": beacon.outcome, "llm.client.chunks": beacon.chunks,
             **extra}
    if verdict is not None:
        attrs["llm.client.buffered"] = verdict.buffered
        attrs["llm.client.held_back_ms"] = verdict.held_back_ms
    if beacon.status is not None:
        attrs["http.response.status_code"] = beacon.status
    if beacon.url_path is not None:
        attrs["url.path"] = beacon.url_path
    span_builder.emit_client_spans(
        trace_id=trace_id, server_span_id=server_span_id,
        client_traceparent=beacon.traceparent,
        start_ns=alignment.to_server_ns(beacon.t.start),
        end_ns=alignment.to_server_ns(max(beacon.t.end, beacon.t.first_paint or 0.0)),
        stages=[(s.stage, s.start_ns, s.end_ns) for s in stages], attributes=attrs,
        stage_attributes=clock, error=None if beacon.outcome == "ok" else beacon.outcome,
        epoch=epoch)


def joined_numbers(beacon: Beacon, server_ttft_ms: float | None) -> dict:
    """Client TTFT, network + gateway time (client TTFT − server TTFT) and render delay."""
    t = beacon.t
    return {"client_ttft_ms": t.first_token,
            "network_overhead_ms": (None if t.first_token is None or server_ttft_ms is None
                                    else t.first_token - server_ttft_ms),
            "render_delay_ms": (None if t.first_paint is None or t.first_token is None
                                else t.first_paint - t.first_token)}


def client_view(record: RequestRecord, beacon: Beacon, alignment, stages,
                verdict: BufferingVerdict | None = None) -> dict:
    """What `record.client` holds: the checked beacon plus the joined numbers. Stage times are
    on the server's perf_counter axis, like the record's own stages."""
    view = beacon.as_dict()   # its `tool_calls`: [{name, start, ready}], ms like `t`
    view.update(joined_numbers(beacon, None if record.ttft_ns is None else record.ttft_ns / 1e6))
    # the first output of any kind, as the browser saw it (text, tool_call or reasoning), and
    # the first tool call's time: the client side of the record's first output
    view["first_output_ms"], view["first_output_kind"] = beacon.t.first_output()
    view["first_tool_call_ms"] = beacon.t.first_tool_call
    view["clock"] = None if alignment is None else alignment.as_dict()
    view["stages"] = [{"stage": s.stage, "start_ns": s.start_ns, "end_ns": s.end_ns}
                      for s in stages]
    view["buffering"] = None if verdict is None else {
        "buffered": verdict.buffered, "held_back_ms": verdict.held_back_ms,
        "num_events": verdict.num_events}
    return view


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3
