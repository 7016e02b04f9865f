"""The stream-format add-on (frontend_probe/formats.js) is served next to the probe, minified
and gzipped, and the sizes quoted in frontend_probe/README.md are what goes on the wire."""
from __future__ import annotations

import gzip
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tracer.web.observability import ObservabilitySettings, build_observability

PROBE = Path(__file__).resolve().parents[2] / "frontend_probe"
# The probe's own budget (bench/probe_size.mjs) and the add-on's: a page that loads both
# fetches less than 4.7 KB gzipped. The add-on's was 1,024 B until issue 37: each format's
# tool-call rule and ready times (OpenAI's too, to keep the core small) measured 1,446 B.
PROBE_BUDGET, ADDON_BUDGET = 3200, 1536


def test_the_add_on_is_served_minified_and_gzipped_next_to_the_probe():
    app = FastAPI()
    build_observability(ObservabilitySettings(tracing=False), model_names=("m",)).include_routes(app)
    wire = {}
    with TestClient(app) as client:
        for url, built in (("/probe/formats.global.js", "formats.global.min.js"),
                           ("/probe/formats.js", "formats.min.js"),
                           ("/probe/probe.global.js", "probe.global.min.js")):
            r = client.get(url, headers={"Accept-Encoding": "gzip"})
            assert r.status_code == 200 and r.headers["content-encoding"] == "gzip", url
            assert r.headers["content-type"].startswith("text/javascript")
            assert r.content == (PROBE / built).read_bytes()
            wire[url] = int(r.headers["content-length"])
            assert wire[url] == len(gzip.compress(r.content, 9, mtime=0))
    assert wire["/probe/probe.global.js"] <= PROBE_BUDGET
    assert wire["/probe/formats.global.js"] <= ADDON_BUDGET
    # the served module imports the probe the way the tracer serves it: /probe/probe.js
    assert b'from"./probe.js"' in (PROBE / "formats.min.js").read_bytes()
