"""The served probe is the minified build, gzipped when accepted (issue 11), and Accept-Encoding
is negotiated as RFC 9110 says (checked against werkzeug's parser)."""
from __future__ import annotations

import gzip
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings, strategies as st
from werkzeug.http import parse_accept_header

from tracer.web.gzip_static import accepts_gzip
from tracer.web.observability import ObservabilitySettings, build_observability

PROBE = Path(__file__).resolve().parents[2] / "frontend_probe"
# bench/probe_size.mjs: 3,072 B until issue 37's tool calls took the core to 3,167 B
BUDGET_GZIP_BYTES = 3200


def _client() -> TestClient:
    app = FastAPI()
    build_observability(ObservabilitySettings(tracing=False), model_names=("m",)).include_routes(app)
    return TestClient(app)


def test_the_served_probe_is_the_minified_build_gzipped_within_budget():
    with _client() as client:
        for url, built, source in (("/probe/probe.global.js", "probe.global.min.js", "probe.global.js"),
                                   ("/probe/probe.js", "probe.min.js", "probe.js")):
            r = client.get(url, headers={"Accept-Encoding": "gzip, deflate, br"})
            assert r.status_code == 200 and r.headers["content-encoding"] == "gzip", url
            assert r.headers["vary"] == "Accept-Encoding"
            assert r.headers["content-type"].startswith("text/javascript")
            wire = int(r.headers["content-length"])
            assert r.content == (PROBE / built).read_bytes(), f"{url} is not {built}"
            assert r.content != (PROBE / source).read_bytes()
            assert len(r.content) < len((PROBE / source).read_bytes()) / 2, f"{url} is not minified"
            assert wire == len(gzip.compress(r.content, 9, mtime=0))
            if url == "/probe/probe.global.js":
                assert wire <= BUDGET_GZIP_BYTES, f"{wire} B gzipped > {BUDGET_GZIP_BYTES} B"


def test_no_gzip_unless_accepted():
    with _client() as client:
        for accept in (None, "identity", "gzip;q=0", "br", "*;q=0"):
            headers = {"Accept-Encoding": accept} if accept else {"Accept-Encoding": ""}
            r = client.get("/probe/probe.global.js", headers=headers)
            assert "content-encoding" not in r.headers, accept
            assert r.headers["vary"] == "Accept-Encoding"
            assert r.content == (PROBE / "probe.global.min.js").read_bytes()
            assert int(r.headers["content-length"]) == len(r.content)


_TOKEN = st.sampled_from(["gzip", "GZip", "br", "deflate", "identity", "*", "compress", "zstd"])
_Q = st.one_of(st.none(), st.sampled_from(["0", "0.0", "0.001", "0.5", "1", "1.000", "0.999"]))
_ELEMENT = st.builds(lambda t, q, ws: t + (f"{ws};{ws}q={q}" if q is not None else ""),
                     _TOKEN, _Q, st.sampled_from(["", " "]))


@settings(max_examples=400, deadline=None)
@given(st.lists(_ELEMENT, max_size=5), st.sampled_from([",", ", ", " ,"]))
def test_accept_encoding_agrees_with_werkzeug(elements, sep):
    header = sep.join(elements)
    assert accepts_gzip(header) == (parse_accept_header(header).quality("gzip") > 0), header


def test_accept_encoding_edge_cases():
    assert accepts_gzip("x-gzip")                       # RFC 9110 §8.4.1.3 alias
    assert not accepts_gzip("gzip;q=0, *")              # named beats the wildcard
    assert accepts_gzip("gzip;q=0.001")
    assert not accepts_gzip("gzip;q=2")                 # malformed weight: element ignored
    assert not accepts_gzip("gzipx, xgzip")
    assert accepts_gzip("deflate,,gzip")
