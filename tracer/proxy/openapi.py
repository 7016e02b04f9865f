"""The proxy's OpenAPI document at /openapi.json, so clients and fuzzers (schemathesis, the
reliability suite) know what it serves.

The completion paths (chat, completions, Anthropic Messages, Responses) are raw ASGI routes
(FastAPI never sees them), and their bodies are relayed to the upstream unchanged: the
document says what the proxy itself reads (a JSON object; `model`, `stream` and the sampling
numbers it records on the span) and allows every other field, since the upstream is the one
that validates. Every error is the OpenAI shape. Every other path the proxy does not serve
itself is passed to the upstream and is not listed.
"""
from __future__ import annotations

from tracer.web.openai_http import ERROR_SCHEMA
from tracer.web.openapi_common import SSE_EVENT_SCHEMA, install_document

_ERROR = {"$ref": "#/components/schemas/ErrorResponse"}
# Only the object is the proxy's rule: it relays any JSON object, and the upstream judges
# the fields (a bound written here would be a promise the proxy does not keep).
_COMPLETION_BODY = {
    "type": "object", "additionalProperties": True,
    "properties": {
        "model": {"description": "A string: the model label and span name when served"},
        "stream": {"description": "true: the answer is server-sent events"},
        "max_tokens": {"description": "Recorded on the span when an int64"},
        "temperature": {"description": "Recorded on the span when a finite number"},
        "top_p": {"description": "Recorded on the span when a finite number"}},
}
_ERRORS = {"400": "The body is not a JSON object", "401": "Missing or wrong API key",
           "413": "Body over the size limit", "502": "The upstream is unreachable",
           "504": "The upstream did not answer in time"}


def install_proxy_openapi(app, completion_paths: dict[str, str]) -> None:
    """Make `app.openapi()` (so /openapi.json) describe `completion_paths` (path → summary)
    next to the routes FastAPI knows."""
    install_document(app, lambda spec: _add_completions(spec, completion_paths))


def _add_completions(spec: dict, completion_paths: dict[str, str]) -> dict:
    spec.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
    error_responses = {status: {"description": text,
                                "content": {"application/json": {"schema": _ERROR}}}
                       for status, text in _ERRORS.items()}
    for path, summary in completion_paths.items():
        spec.setdefault("paths", {})[path] = {"post": {
            "summary": summary, "operationId": "proxy" + path.replace("/", "_"),
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": _COMPLETION_BODY}}},
            "responses": {
                "200": {"description": "The upstream's answer, relayed unchanged: JSON, or "
                                       "server-sent events when `stream` is true",
                        "content": {"application/json": {"schema": {"type": "object"}},
                                    "text/event-stream": {"schema": SSE_EVENT_SCHEMA}}},
                **error_responses}}}
    return spec
