"""The proxy's catch-all: what reaches the upstream without being one of the relayed
completion paths, and what never does.

A request the proxy's own routes did not take is forwarded (e.g. `/v1/models`), except:

- a path the proxy serves itself with another method: a 405 with `Allow` (RFC 9110
  §15.5.6), not a request the upstream would read as a different resource;
- a CORS preflight: the proxy's CORS layer (tracer/web/cors.py) answers every preflight when
  an origin is allowed, so one that comes here finds no policy and is refused (403);
- a request without the API key: no path is open here, whatever the front's open paths
  (`/health/x` is the upstream's, not our `/health`).
docs/reference.md, "Access, beacon tokens and connection limits".
"""
from __future__ import annotations

from starlette.routing import Match

from tracer.web.auth import AUTHORIZED_KEY, CHALLENGE, is_preflight, unauthorized
from tracer.web.openai_http import OpenAIError
from tracer.web.routes import leaf_routes


class Passthrough:
    """ASGI around `forward` (`ProxyServing.passthrough`); `routes` is the app's live route
    list, read per request (this Mount is in it, and skipped).

    The key itself was checked by the front's `ApiKeyGate` (tracer/web/auth.py), which
    records the outcome in the scope's state before the client's `Authorization` is
    replaced (`UpstreamAuthorization`); without that record, the request is refused.

    >>> Passthrough(routes=[], forward=None, api_key="k").key_required
    True
    """

    def __init__(self, routes: list, forward, api_key: str | None) -> None:
        self.routes = routes
        self.forward = forward
        self.key_required = bool(api_key)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.forward(scope, receive, send)
        allowed = self.allowed_methods(scope)
        if allowed:
            return await OpenAIError(
                405, f"{scope['method']} is not served on this path; it serves "
                f"{', '.join(allowed)}", code="method_not_allowed").response(
                {"Allow": ", ".join(allowed)})(scope, receive, send)
        if is_preflight(scope):
            return await OpenAIError(
                403, "CORS preflight refused: no origin is allowed here (--cors-origin)",
                code="cors_origin_not_allowed", type_="permission_error").response()(
                scope, receive, send)
        if self.key_required and scope.get("state", {}).get(AUTHORIZED_KEY) is not True:
            return await unauthorized().response(CHALLENGE)(scope, receive, send)
        await self.forward(scope, receive, send)

    def allowed_methods(self, scope) -> list[str]:
        """The methods of the proxy's own routes whose path matches `scope`'s; [] when none
        does (the path is the upstream's)."""
        return sorted(_methods_at(self.routes, scope))


def _methods_at(routes: list, scope) -> set[str]:
    methods: set[str] = set()
    for route in leaf_routes(routes):
        if route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods
    return methods
