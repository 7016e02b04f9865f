"""The API key of a ttftscope front (engine server or proxy): one gate, shared by both.

With a key set, every request needs `Authorization: Bearer <key>` (RFC 6750 §2.1), compared
in constant time, except the paths that must stay open: `/health` and `/metrics` (probes and
scrapes), `/v1/probe` (`navigator.sendBeacon` cannot send a header; beacons carry their own
token, tracer/web/probe/token.py), `/demo`, `/probe/*.js` and the `/ui` page and its assets.
The UI's data, `/ui/api/*`, lists every trace id and is behind the key: the page asks for
the key and keeps it in the tab's `sessionStorage` (never in the URL, where it would reach
history, logs and `Referer`). A refusal is a 401 in the OpenAI error shape with
`WWW-Authenticate: Bearer` (RFC 9110 §15.5.2 requires the challenge).
"""
from __future__ import annotations

import hmac

from tracer.web.openai_http import OpenAIError

# Open prefixes, each matching the path itself or anything under it ("/ui" matches "/ui/ui.js").
OPEN_PREFIXES = ("/health", "/metrics", "/v1/probe", "/ui", "/demo", "/probe")
# ...except these, which hold request data.
PROTECTED_PREFIXES = ("/ui/api",)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def is_open_path(path: str) -> bool:
    """True when `path` needs no API key.

    >>> [is_open_path(p) for p in ("/health", "/ui", "/ui/ui.js", "/ui/api/requests",
    ...                            "/v1/chat/completions", "/healthz", "/v1/probe")]
    [True, True, True, False, False, False, True]
    """
    if any(_under(path, p) for p in PROTECTED_PREFIXES):
        return False
    return any(_under(path, p) for p in OPEN_PREFIXES)


class ApiKeyGate:
    """Pure ASGI: 401 in the OpenAI shape unless `Authorization: Bearer <key>` matches; a
    no-op without a key. CORS preflights (OPTIONS) pass, as a browser sends them without
    credentials.

    >>> ApiKeyGate(app=None, api_key=None).expected is None
    True
    """

    def __init__(self, app, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if (self.expected is not None and scope["type"] == "http"
                and scope["method"] != "OPTIONS" and not is_open_path(scope["path"])):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                err = OpenAIError(401, "Incorrect or missing API key: send "
                                  "'Authorization: Bearer <key>'.", code="invalid_api_key")
                return await err.response({"WWW-Authenticate": 'Bearer realm="ttftscope"'})(
                    scope, receive, send)
        await self.app(scope, receive, send)
