"""A beacon's client stages as durations: what `llm_client_stage_duration_seconds` observes.

The stages stack (docs/reference.md, "Metrics"): from the user's Enter to the first character
on screen,

    input → dns → tcp → tls → request → first_byte → first_token → first_paint

- `input`: `TTFTProbe.markInput()` → `fetch()` (only when the page called markInput);
- `dns`, `tcp`, `tls`: the Resource Timing phases of the request's connection (0 on a reused
  connection; absent when the browser hides them: cross-origin without Timing-Allow-Origin).
  `tcp` is `connect_ms − tls_ms`, since Resource Timing's connect phase includes TLS;
- `request`: `fetch()` → response headers, less dns, tcp and tls: sending the request, the
  server's work up to its headers, the network legs and any browser queueing. Without
  Resource Timing it is the whole `client.request` stage;
- `first_byte`, `first_token`, `first_paint`: the client stages of docs/architecture.md,
  "The client stages" (headers → first body byte → first content → the next frame).

So input + dns + tcp + tls + request + first_byte + first_token is the time from Enter to
the first token. As in `alignment.place_client_stages`, a milestone the browser did not
report leaves its stage out, and the next stage starts at the last known boundary.
"""
from __future__ import annotations

from tracer.web.probe.beacon import Beacon

_AFTER_HEADERS = ("first_byte", "first_token", "first_paint")


def client_stage_ms(beacon: Beacon) -> dict[str, float]:
    """Client stage → ms, for the stages this beacon can tell (never negative).

    >>> from tracer.web.probe.schema import parse_beacon
    >>> b = parse_beacon(b'{"v":1,"trace_id":null,"outcome":"ok","input_ms":12,'
    ...     b'"t":{"start":0,"headers":40,"first_byte":41,"first_token":55,"end":90},'
    ...     b'"resource":{"dns_ms":3,"connect_ms":10,"tls_ms":6,"request_ms":20,"response_ms":50}}')
    >>> client_stage_ms(b)
    {'input': 12.0, 'dns': 3.0, 'tcp': 4.0, 'tls': 6.0, 'request': 27.0, 'first_byte': 1.0, 'first_token': 14.0}
    """
    t, out = beacon.t, {}
    if beacon.input_ms is not None:
        out["input"] = beacon.input_ms
    boundary = t.start
    if t.headers is not None:
        request = t.headers - t.start
        resource = beacon.resource
        if resource is not None:
            tls = resource["tls_ms"]
            phases = {"dns": resource["dns_ms"], "tcp": max(resource["connect_ms"] - tls, 0.0),
                      "tls": tls}
            out.update(phases)
            request -= sum(phases.values())
        out["request"] = max(request, 0.0)
        boundary = t.headers
    for stage in _AFTER_HEADERS:
        end = getattr(t, stage)
        if end is not None:
            out[stage] = max(end - boundary, 0.0)
            boundary = end
    return out


def chunk_gaps_ms(beacon: Beacon) -> list[float]:
    """The gaps between consecutive reported content-chunk arrivals (`chunk_ms`).

    >>> from tracer.web.probe.schema import parse_beacon
    >>> chunk_gaps_ms(parse_beacon(b'{"v":1,"trace_id":null,"outcome":"ok","chunks":3,'
    ...     b'"chunk_ms":[55,70,71.5],"t":{"start":0,"first_token":55,"end":90}}'))
    [15.0, 1.5]
    """
    c = beacon.chunk_ms
    return [b - a for a, b in zip(c, c[1:])]
