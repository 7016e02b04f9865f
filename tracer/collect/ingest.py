"""The collector's beacons: the in-band join as before, then the trace's assembly.

A beacon with signed in-band timing (tracer/web/inband.py) is joined from it at once by
`ProbeIngestor` (client metrics, client spans in the server's trace), exactly as on any
other process holding the key; a beacon with only its `Server-Timing` token (checked by the
endpoint before this runs) has no server timing of its own and waits for its spans. Either
way it goes to `PendingTraces`, which assembles the whole path once the spans are in; the
first beacon of a trace wins there too. With a relay, a beacon that came to `/v1/probe`
goes first to the collector owning its trace (tracer/collect/beacon_relay.py), which
ingests it with `relayed=True`.
"""
from __future__ import annotations

from tracer.collect.beacon_relay import beacon_export
from tracer.collect.pending import PendingTraces
from tracer.web.otlp_forward import OtlpForwarder
from tracer.web.otlp_receiver import PROTOBUF
from tracer.web.probe.beacon import Beacon
from tracer.web.probe.ingest import ProbeIngestor


class CollectorIngestor:
    """What `ProbeEndpoint.ingestor` is on the collector."""

    def __init__(self, inband: ProbeIngestor, pending: PendingTraces,
                 relay: OtlpForwarder | None = None) -> None:
        self.inband = inband
        self.pending = pending
        # The balancer's OTLP endpoint: beacons go to the collector owning their trace.
        self.relay = relay

    def ingest(self, beacon: Beacon, server=None, *, relayed: bool = False) -> str:
        trace_id = server.trace_id if server is not None else beacon.trace_id
        if trace_id is None:
            return "unmatched"
        if self.relay is not None and not relayed:
            self.relay.submit(beacon_export(beacon, trace_id), PROTOBUF, None)
            return "relayed"
        if server is not None:
            outcome = self.inband.ingest(beacon, server)
            if outcome != "accepted" or not self.pending.receiving_spans:
                # Joined from its in-band timing; with no span export to this collector
                # (yet), there is no whole path to wait for (docs/architecture.md, "The
                # whole path").
                return outcome
        added = self.pending.add_beacon(trace_id, beacon, server,
                                        client_observed=server is not None)
        return "accepted" if added or server is not None else "unmatched"

    @property
    def num_remote_joins(self) -> int:
        return self.inband.num_remote_joins
