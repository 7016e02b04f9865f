"""What every front's OpenAPI document says about the routes they share (`/metrics`, `/health`,
`/v1/probe`, `/ui/api/*`) that FastAPI cannot infer: the scrape's media types, and no
validation error where nothing is validated by FastAPI.

Every front's document is built by `install_document`: FastAPI's output, what the front adds
(instrumented_engine/server/openapi.py, tracer/proxy/openapi.py), then `complete_shared_paths`,
so schemathesis' checks hold it to the truth.
"""
from __future__ import annotations

from collections.abc import Callable

from fastapi.openapi.utils import get_openapi

# The Prometheus text format, or OpenMetrics (with exemplars) when the scrape asks for it.
METRICS_CONTENT = {"text/plain": {"schema": {"type": "string"}},
                   "application/openmetrics-text": {"schema": {"type": "string"}}}
# One server-sent event as a reader parses it (the SSE spec's fields): what a streamed
# completion's `text/event-stream` answer is a sequence of.
SSE_EVENT_SCHEMA = {"type": "object", "required": ["data"],
                    "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                                   "id": {"type": "string"}, "retry": {"type": "integer"}}}
_UI_API_PREFIX = "/ui/api/"


def complete_shared_paths(spec: dict) -> dict:
    """`spec` with `/metrics` as text, without the 422 FastAPI adds for query and path
    parameters the UI API reads as plain strings itself (its bad values are 400s, which its
    routes document), and without HEAD operations: every GET route answers HEAD too
    (tracer/web/routes.py), which HTTP defines as GET without the content, so the document
    lists the GET alone.

    >>> spec = {"paths": {"/metrics": {"get": {"responses": {"200": {"content": {
    ...     "application/json": {}}}}}}, "/ui/api/requests": {"get": {"responses": {
    ...     "200": {}, "422": {}}}}}}
    >>> sorted(complete_shared_paths(spec)["paths"]["/metrics"]["get"]["responses"]["200"]["content"])
    ['application/openmetrics-text', 'text/plain']
    >>> sorted(spec["paths"]["/ui/api/requests"]["get"]["responses"])
    ['200']
    >>> "head" in complete_shared_paths({"paths": {"/health": {"get": {}, "head": {}}}})["paths"]["/health"]
    False
    """
    paths = spec.get("paths", {})
    scrape = paths.get("/metrics", {}).get("get")
    if scrape is not None:
        scrape["responses"]["200"] = {"description": "The metrics", "content": METRICS_CONTENT}
    for path, operations in paths.items():
        operations.pop("head", None)
        if path.startswith(_UI_API_PREFIX):
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
    return spec


def install_document(app, extend: Callable[[dict], dict] | None = None) -> None:
    """Make `app.openapi()` (so /openapi.json) FastAPI's document of `app`'s routes, passed
    through `extend` (the front's own paths and bodies) and `complete_shared_paths`, built
    once, at the first read."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = complete_shared_paths(spec if extend is None else extend(spec))
        return app.openapi_schema

    app.openapi = openapi
