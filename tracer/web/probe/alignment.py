"""Client stages on the server's timeline: midpoint clock alignment and placement.

The browser's clock (`performance.now()`, ms since the probe's fetch call) and the server's
(`perf_counter_ns`) share no origin and may drift, so the client timestamps are placed on the
server axis NTP-style (docs/architecture.md, "The client stages"): the request's round trip
[client start, client headers] encloses the server's [receive start, response start], and
assuming the uplink and downlink take equally long, their midpoints coincide:

    θ = server_mid − client_mid            (server_ns = client_ms · 1e6 + θ)
    uncertainty = ((headers − start) − (response_start − receive_start)) / 2

The uncertainty is the NTP error bound: the true offset lies within θ ± uncertainty whatever
the split of the network time. A non-streamed response has no `response_start` event; its
headers leave with the body, so the server's anchor is the record's end.

The placed stages become spans in `tracer.sinks.spans.SpanBuilder.emit_client_spans`
(which decides the span tree) and numbers in the record's `client` view (`ingest.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.record.request_record import RequestRecord
from tracer.web.probe.client_times import ClientTimes

# Client stage name → (start boundary, end boundary) in ClientTimes; contiguous, in order.
CLIENT_STAGE_BOUNDS = (
    ("client.request", "start", "headers"),
    ("client.first_byte", "headers", "first_byte"),
    ("client.first_token", "first_byte", "first_token"),
    ("client.first_paint", "first_token", "first_paint"),
)


@dataclass(slots=True, frozen=True)
class ClockAlignment:
    """Maps browser ms to server perf_counter ns for one request.

    >>> a = ClockAlignment(offset_ns=990_000_000, uncertainty_ns=10_000_000, anchor="response_start")
    >>> a.to_server_ns(25.0)
    1015000000
    """

    offset_ns: int          # θ: server_ns − client_ns for the same instant
    uncertainty_ns: int     # half the round trip not spent inside the server (≥ 0)
    anchor: str             # "response_start" | "end": the server instant paired with t.headers

    def to_server_ns(self, client_ms: float) -> int:
        return round(client_ms * 1e6) + self.offset_ns

    def as_dict(self) -> dict:
        return {"skew_ms": self.offset_ns / 1e6, "uncertainty_ms": self.uncertainty_ns / 1e6,
                "anchor": self.anchor}


@dataclass(slots=True, frozen=True)
class ClientStage:
    """A client stage placed on the server's perf_counter axis."""

    stage: str
    start_ns: int
    end_ns: int


def response_start_ns(record: RequestRecord) -> tuple[int, str]:
    """The server instant the response headers left, and which anchor it is."""
    for name, t_ns, _attrs in record.events:
        if name == "response_start":
            return t_ns, "response_start"
    return record.end_ns, "end"


def align(record: RequestRecord, times: ClientTimes) -> ClockAlignment | None:
    """θ and its uncertainty, or None when the browser never saw the headers."""
    if times.headers is None:
        return None
    server_start_ns = record.start_ns
    server_resp_ns, anchor = response_start_ns(record)
    client_start_ns, client_headers_ns = round(times.start * 1e6), round(times.headers * 1e6)
    # Doubled midpoints keep the arithmetic in exact integers.
    offset_ns = ((server_start_ns + server_resp_ns) - (client_start_ns + client_headers_ns)) // 2
    network_ns = (client_headers_ns - client_start_ns) - (server_resp_ns - server_start_ns)
    # Negative: the browser saw a shorter round trip than the server spent, which only a late
    # server mark (its thread descheduled right after the write), timer coarsening or a
    # mis-paired anchor can cause; the midpoint is still the best estimate, and the
    # inconsistency itself bounds its error, so the uncertainty is |network| / 2 either way.
    return ClockAlignment(offset_ns, abs(network_ns) // 2, anchor)


def place_client_stages(times: ClientTimes, alignment: ClockAlignment) -> tuple[ClientStage, ...]:
    """The contiguous client stages on the server axis; a stage whose end the browser did not
    report is left out (the next one then starts at the last known boundary)."""
    stages, start_ms = [], times.start
    for stage, _start_field, end_field in CLIENT_STAGE_BOUNDS:
        end_ms = getattr(times, end_field)
        if end_ms is None:
            continue
        stages.append(ClientStage(stage, alignment.to_server_ns(start_ms),
                                  alignment.to_server_ns(end_ms)))
        start_ms = end_ms
    return tuple(stages)


def align_inband(timing, times: ClientTimes) -> ClockAlignment | None:
    """The same midpoint rule on the in-band timing of the server that answered
    (tracer/web/inband.py), for a beacon with no local record: its [0, resp_ms] after
    `recv_unix_ns` pairs with the browser's [start, headers]. The result maps browser ms to
    *Unix* ns on that server's wall clock (spans take `epoch=True`).

    >>> from types import SimpleNamespace
    >>> from tracer.web.probe.client_times import ClientTimes
    >>> timing = SimpleNamespace(recv_unix_ns=10**18, resp_ms=2.0)
    >>> a = align_inband(timing, ClientTimes(start=0, headers=12.0, first_byte=13.0,
    ...                                         first_token=30.0, end=40.0))
    >>> a.to_server_ns(6.0) - 10**18, a.uncertainty_ns    # the midpoints meet: 6 ms ↔ 1 ms
    (1000000, 5000000)
    """
    if times.headers is None:
        return None
    server_start_ns = timing.recv_unix_ns
    server_resp_ns = server_start_ns + round(timing.resp_ms * 1e6)
    client_start_ns, client_headers_ns = round(times.start * 1e6), round(times.headers * 1e6)
    offset_ns = ((server_start_ns + server_resp_ns) - (client_start_ns + client_headers_ns)) // 2
    network_ns = (client_headers_ns - client_start_ns) - (server_resp_ns - server_start_ns)
    return ClockAlignment(offset_ns, abs(network_ns) // 2, "inband")
