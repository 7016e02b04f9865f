"""Walking a FastAPI app's routes, and HEAD wherever GET is served.

FastAPI keeps an included router's routes inside it, undivided (`original_router`), so a
walk of `app.routes` recurses there; ours are included without a prefix.

RFC 9110 §9.3.2: a server answers HEAD as it would GET, without the content. Starlette's
`Route` adds HEAD to a GET route by itself; FastAPI's `APIRoute` serves only the methods it
was declared with, so `HEAD /health` from a load balancer got a 405. `serve_head` adds HEAD
to every GET route once the app's routes are in; the endpoint runs as for GET, and uvicorn,
reading the request's own method, sends the head (with the length GET's body would have)
and no body.
"""
from __future__ import annotations

from collections.abc import Iterator

from starlette.routing import Mount


def leaf_routes(routes: list) -> Iterator:
    """Every route of `routes` with its own methods: included routers opened, mounts left
    out (a mounted app answers for its methods itself)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from leaf_routes(inner.routes)
        elif not isinstance(route, Mount) and getattr(route, "methods", None):
            yield route


def serve_head(app) -> None:
    """Let every GET route of `app` answer HEAD too."""
    for route in leaf_routes(app.routes):
        if "GET" in route.methods:
            route.methods.add("HEAD")
