"""A static file's response, gzipped when the client accepts gzip (the probe, the UI, the demo).

Content negotiation follows RFC 9110 §12.5.3 (Accept-Encoding): a coding is acceptable when
its weight is above 0, named (`gzip`, or its alias `x-gzip`, §8.4.1.3) or else through `*`;
`gzip;q=0` refuses it. No header means identity here (the RFC allows any coding, but a client
that sends none is usually a script that would not decode it). Every response says
`Vary: Accept-Encoding`, so a cache keeps the two forms apart. The body is compressed per
request (a few KB at level 9: well under a millisecond) with mtime 0, so the same file always
gives the same bytes.
"""
from __future__ import annotations

import gzip
import re
from pathlib import Path

from starlette.responses import Response

# One element of the list: a coding token, then parameters; only q matters (RFC 9110 §12.4.2).
_ELEMENT = re.compile(r"^\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*((?:;[^;]*)*)$")
_QVALUE = re.compile(r"^\s*q\s*=\s*(0(?:\.\d{0,3})?|1(?:\.0{0,3})?)\s*$", re.IGNORECASE)


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding value makes gzip acceptable.

    >>> accepts_gzip("gzip, deflate, br"), accepts_gzip("br;q=1, gzip;q=0"), accepts_gzip("*")
    (True, False, True)
    >>> accepts_gzip(None), accepts_gzip("identity"), accepts_gzip("*;q=0.5, gzip;q=0")
    (False, False, False)
    """
    if not header:
        return False
    named = star = None
    for element in header.split(","):
        m = _ELEMENT.match(element)
        if m is None:
            continue   # an empty or malformed element is ignored, not fatal
        q = _weight(m[2])
        if q is None:
            continue
        coding = m[1].lower()
        if coding in ("gzip", "x-gzip"):
            named = q if named is None else max(named, q)
        elif coding == "*":
            star = q if star is None else max(star, q)
    weight = named if named is not None else star
    return weight is not None and weight > 0


def _weight(params: str) -> float | None:
    """The q of `;a=b;q=0.5` (1 when absent), or None when q is malformed."""
    for param in params.split(";")[1:]:
        if param.strip().lower().startswith("q"):
            m = _QVALUE.match(param)
            return float(m[1]) if m else None
    return 1.0


def file_response(path: Path, media_type: str | None, accept_encoding: str | None,
                  headers: dict[str, str]) -> Response:
    """`path`'s bytes (gzipped when accepted), with `headers` and `Vary: Accept-Encoding`."""
    body = path.read_bytes()
    out = {**headers, "Vary": "Accept-Encoding"}
    if accepts_gzip(accept_encoding):
        body = gzip.compress(body, compresslevel=9, mtime=0)
        out["Content-Encoding"] = "gzip"
    return Response(body, media_type=media_type, headers=out)
