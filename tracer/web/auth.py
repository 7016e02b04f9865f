"""The API key of a ttftscope front (engine server or proxy): one gate, shared by both.

With a key set, every request needs `Authorization: Bearer <key>` (RFC 6750 §2.1), compared
in constant time, except the exact paths the front serves itself and that must stay open:
`/health` and `/metrics` (probes and scrapes), `/v1/probe` (`navigator.sendBeacon` cannot
send a header; beacons carry their own token, tracer/web/probe/token.py), the `/demo` page,
the `/probe/*.js` files and the `/ui` page and its assets. Open means those exact paths,
never a prefix: `/health/x` is not `/health`. The UI's data, `/ui/api/*`, lists every trace
id and is behind the key: the page asks for the key and keeps it in the tab's
`sessionStorage` (never in the URL, where it would reach history, logs and `Referer`). A
refusal is a 401 in the OpenAI error shape with `WWW-Authenticate: Bearer` (RFC 9110
§15.5.2 requires the challenge). A CORS preflight (RFC: Fetch, "CORS-preflight request")
passes without the key, as a browser sends it without credentials.

Before any of this, the request target's path is checked, key or not: a dot segment
(RFC 3986 §3.3, which §5.2.4 would remove), an encoded dot, slash or backslash (`%2e`,
`%2f`, `%5c`) or a raw backslash is refused with a 400. Behind a proxy those are how a path
that one hop reads as `/health/..` becomes `/v1/chat/completions` at the next, and no client
of ours has any business sending them. The check reads `raw_path`, the target as sent:
uvicorn percent-decodes `scope["path"]`. docs/reference.md, "Access, beacon tokens and
connection limits".
"""
from __future__ import annotations

import hmac
import re

from tracer.web.openai_http import OpenAIError

# The exact paths served by the front itself without the key (tracer/web/observability.py
# `include_routes` and tracer/web/ui_api.py serve them); anything else needs it.
OPEN_PATHS = frozenset((
    "/health", "/metrics", "/v1/probe",
    "/ui", "/ui/", "/ui/ui.css", *(f"/ui/{name}" for name in (
        "dom.js", "api.js", "palette.js", "requests_table.js", "attribution.js", "waterfall.js",
        "facts.js", "verdict.js", "ui.js", "timeline.js")),
    "/demo", "/demo/", "/demo/demo.js", "/demo/demo.css",
    "/probe/probe.js", "/probe/probe.global.js", "/probe/formats.js", "/probe/formats.global.js",
))
# scope["state"] key: True once the gate found the key right (or none is set), for what runs
# behind it and must not trust an open path (the proxy's passthrough).
AUTHORIZED_KEY = "ttftscope.api_key_ok"
# Encoded `.`, `/`, `\` (any case), a raw backslash, or a `.` / `..` segment.
_UNSAFE_PATH = re.compile(rb"%(?:2e|2f|5c)|\\|(?:^|/)\.{1,2}(?:/|$)", re.IGNORECASE)


def is_open_path(path: str, open_paths: frozenset[str] = OPEN_PATHS) -> bool:
    """True when `path` needs no API key: one of `open_paths`, exactly.

    >>> [is_open_path(p) for p in ("/health", "/ui", "/ui/ui.js", "/ui/api/requests",
    ...                            "/v1/chat/completions", "/healthz", "/health/x", "/v1/probe")]
    [True, True, True, False, False, False, False, True]
    """
    return path in open_paths


def unsafe_path_error(scope) -> OpenAIError | None:
    """The 400 for a request target with dot segments or encoded separators, else None.

    >>> [unsafe_path_error({"raw_path": p, "path": ""}) is None for p in (
    ...     b"/v1/models", b"/health/../v1/models", b"/ui/%2E%2e/v1/models", b"/a%2fb",
    ...     b"/a\\\\b", b"/.", b"/v1/models.json", b"/a/..b")]
    [True, False, False, False, False, False, True, True]
    """
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    if _UNSAFE_PATH.search(raw) is None:
        return None
    return OpenAIError(400, "the request path holds a dot segment or an encoded '.', '/' or "
                       "'\\': send the path in its plain, normalised form", code="invalid_path")


def is_preflight(scope) -> bool:
    """A CORS preflight: OPTIONS with `Origin` and `Access-Control-Request-Method`.

    >>> is_preflight({"method": "OPTIONS", "headers": [(b"origin", b"https://a.example"),
    ...               (b"access-control-request-method", b"POST")]})
    True
    >>> is_preflight({"method": "OPTIONS", "headers": []})
    False
    """
    if scope["method"] != "OPTIONS":
        return False
    names = {k for k, _v in scope["headers"]}
    return b"origin" in names and b"access-control-request-method" in names


def unauthorized() -> OpenAIError:
    """The refusal of a request without the right key (sent with `CHALLENGE`)."""
    return OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                       code="invalid_api_key")


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="ttftscope"'}


class ApiKeyGate:
    """Pure ASGI: 400 for an unsafe path (always), then 401 in the OpenAI shape unless
    `Authorization: Bearer <key>` matches, the path is one of `open_paths` or the request
    is a CORS preflight; a key check no-op without a key.

    >>> ApiKeyGate(app=None, api_key=None).expected is None
    True
    """

    def __init__(self, app, api_key: str | None,
                 open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = unsafe_path_error(scope)
            if refusal is not None:
                return await refusal.response()(scope, receive, send)
            ok = self.authorized(scope)
            scope.setdefault("state", {})[AUTHORIZED_KEY] = ok
            if not (ok or is_open_path(scope["path"], self.open_paths) or is_preflight(scope)):
                return await unauthorized().response(CHALLENGE)(scope, receive, send)
        await self.app(scope, receive, send)

    def authorized(self, scope) -> bool:
        """True without a key, or when the request's `Authorization` is `Bearer <key>`."""
        if self.expected is None:
            return True
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(given, self.expected)
