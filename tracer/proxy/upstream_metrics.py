"""Re-export a foreign engine's own `/metrics` from the proxy, under the engine's own names.

vLLM (`vllm:*`), SGLang (`sglang:*`) and the llama.cpp server (`llamacpp:*`) report what the
proxy cannot see (queue time, prefill time, their own TTFT histograms; docs/reference.md,
"Engines' metric names"). `UpstreamMetricsCollector` fetches the upstream's exposition when the
proxy is scraped, with a short timeout, keeps the families whose names start with an
allowed prefix, and yields them unchanged; an absent, slow or broken upstream endpoint
yields nothing, never an error.

The families are rendered by `render_families`, not by prometheus_client's OpenMetrics
encoder: prometheus_client 0.26 rewrites `:` to `_` in OpenMetrics *sample* names but not
in the `# TYPE` line, so `vllm:…` samples would no longer match their family.
"""
from __future__ import annotations

import math
import ssl
from collections.abc import Iterable, Iterator

import httpx
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

# Engines' metric prefixes (docs/reference.md, "Engines' metric names"); our own names never match,
# so re-exporting from our engine cannot collide with the proxy's metrics.
DEFAULT_PREFIXES = ("vllm:", "sglang:", "llamacpp:", "tgi_")
_TEXT_ACCEPT = "text/plain;version=0.0.4;q=1.0"
_MAX_BODY_BYTES = 8 << 20   # a bigger exposition is not a metrics page we want to relay
_OM_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                "_created", "_gcount", "_gsum"), "summary": ("_count", "_sum", "_created", ""),
                "gauge": ("",), "info": ("_info",), "stateset": ("",), "unknown": ("",)}


class UpstreamMetricsCollector:
    """A prometheus_client collector that relays the upstream's metric families at scrape time.

    >>> collector = UpstreamMetricsCollector("http://127.0.0.1:9", timeout_s=0.2)
    >>> list(collector.collect()), collector.last_ok    # nothing listening: no families
    ([], False)
    """

    def __init__(self, url: str, *, timeout_s: float = 0.5,
                 prefixes: Iterable[str] = DEFAULT_PREFIXES,
                 transport: httpx.BaseTransport | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.url = url
        self.prefixes = tuple(prefixes)
        self.last_ok = False
        self._client = httpx.Client(timeout=timeout_s, trust_env=False, transport=transport,
                                    verify=verify)

    def describe(self) -> list:
        # Nothing up front: registering must not fetch, and the names are not known yet.
        return []

    def collect(self) -> Iterator[Metric]:
        text = self._fetch()
        self.last_ok = text is not None
        if text is None:
            return iter(())
        try:
            families = [f for f in text_string_to_metric_families(text)
                        if f.name.startswith(self.prefixes)]
        except Exception:   # the parser raises ValueError and friends on garbage
            self.last_ok = False
            return iter(())
        return iter(families)

    def _fetch(self) -> str | None:
        try:
            with self._client.stream("GET", self.url, headers={"accept": _TEXT_ACCEPT}) as r:
                if r.status_code != 200:
                    return None
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > _MAX_BODY_BYTES:
                        return None
                    chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", errors="replace")
        except httpx.HTTPError:
            return None

    def close(self) -> None:
        self._client.close()


def render_families(families: Iterable[Metric], *, openmetrics: bool) -> bytes:
    """Text exposition of `families` (classic 0.0.4, or OpenMetrics without `# EOF`),
    names kept exactly as the upstream wrote them."""
    out: list[str] = []
    for family in families:
        kind = "unknown" if family.type == "untyped" else family.type
        if family.name.endswith("_created"):
            continue   # creation timestamps (a classic-format artefact), not measurements
        if openmetrics and not _fits_openmetrics(family, kind):
            continue   # e.g. a counter without `_total`: not valid OpenMetrics, skipped
        name = family.name
        if not openmetrics:
            kind = "untyped" if kind == "unknown" else kind
            if kind == "counter" and any(s.name == name + "_total" for s in family.samples):
                name += "_total"
        out.append(f"# HELP {name} {_escape_help(family.documentation)}\n")
        out.append(f"# TYPE {name} {kind}\n")
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sample.labels.items())
            out.append(f"{sample.name}{{{labels}}} {_float(sample.value)}\n" if labels
                       else f"{sample.name} {_float(sample.value)}\n")
    return "".join(out).encode()


def _fits_openmetrics(family: Metric, kind: str) -> bool:
    suffixes = _OM_SUFFIXES.get(kind)
    if suffixes is None:
        return False
    return all(s.name.startswith(family.name) and s.name[len(family.name):] in suffixes
               for s in family.samples)


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def combine_exposition(own: bytes, upstream: bytes, *, openmetrics: bool) -> bytes:
    """Our exposition with the upstream's families added (before OpenMetrics' `# EOF`)."""
    if not upstream:
        return own
    if openmetrics and own.endswith(b"# EOF\n"):
        return own[:-len(b"# EOF\n")] + upstream + b"# EOF\n"
    return own + upstream
