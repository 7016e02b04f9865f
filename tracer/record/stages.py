"""Stage names, in pipeline order: the contract of docs/architecture.md, "The stage contract"."""
from __future__ import annotations

# Server-side stages; each ends where the next begins, so their sum is the server TTFT.
SERVER_STAGES: tuple[str, ...] = (
    "receive", "template", "tokenize", "kv_lookup", "queue",
    "prefill", "sample", "detokenize", "send",
)
# Time inside TTFT that no recorded boundary covers. Tests assert it is zero for our engine.
UNATTRIBUTED = "unattributed"
ALL_STAGE_LABELS: tuple[str, ...] = SERVER_STAGES + (UNATTRIBUTED,)

# Stages a proxy in front of a foreign engine can see (the nine as seen from outside;
# docs/architecture.md, "The proxy's stages").
PROXY_STAGES: tuple[str, ...] = (
    "receive", "upstream_connect", "upstream_ttfb", "upstream_first_token", "send",
)

# Client-side stages reported by the browser probe.
CLIENT_STAGES: tuple[str, ...] = (
    "client.request", "client.first_byte", "client.first_token", "client.first_paint",
)

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error")
OPERATIONS: tuple[str, ...] = ("chat", "text_completion")
