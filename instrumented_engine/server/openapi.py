"""The engine server's OpenAPI document, served at /openapi.json as vLLM and OpenAI do, so
clients and fuzzers (schemathesis) know the real request bodies.

The completion routes read their body themselves (size limit first, the `receive` stage
mark after validation), so FastAPI cannot see their body models; the document is completed
here with the pydantic models of `protocol.py` that `parse_request` validates against.
"""
from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from instrumented_engine.engine.sampling import (
    MAX_SEED,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    MIN_SEED,
)
from instrumented_engine.server.protocol import ChatCompletionRequest, CompletionRequest
from tracer.web.openai_http import ERROR_SCHEMA
from tracer.web.openapi_common import SSE_EVENT_SCHEMA, install_document

_REF = "#/components/schemas/{model}"
_BODIES: dict[str, type[BaseModel]] = {"/v1/chat/completions": ChatCompletionRequest,
                                       "/v1/completions": CompletionRequest}
_ERROR_STATUSES = {"400": "Invalid request", "401": "Missing or wrong API key",
                   "404": "Unknown model", "413": "Body over the size limit",
                   "500": "The engine failed on this request"}


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` (and so /openapi.json) describe the completion request bodies."""
    install_document(app, _add_bodies)


def _add_bodies(spec: dict) -> dict:
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorResponse"] = ERROR_SCHEMA
    for path, model in _BODIES.items():
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        _state_checks(schema["properties"])
        operation = spec["paths"][path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}}
        operation["responses"] = {
            "200": {"description": "The completion: a JSON body, or server-sent events when "
                                   "`stream` is true",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": SSE_EVENT_SCHEMA}}},
            **{status: {"description": text, "content": {"application/json": {
                "schema": {"$ref": _REF.format(model="ErrorResponse")}}}}
               for status, text in _ERROR_STATUSES.items()}}
    return spec


_STOP = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
# The checks `protocol.py`'s validators and `SamplingParams` make in code, which pydantic's
# JSON Schema cannot see: each a 400 when broken.
_CHECKS = {
    "temperature": {"minimum": 0, "maximum": MAX_TEMPERATURE},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": 0},
    "seed": {"minimum": MIN_SEED, "maximum": MAX_SEED},
    "max_tokens": {"minimum": 1},
    "max_completion_tokens": {"minimum": 1},
}


def _state_checks(properties: dict) -> None:
    for name, bounds in _CHECKS.items():
        for branch in _branches(properties.get(name)):
            if branch.get("type") in ("integer", "number"):
                branch.update(bounds)
    if "n" in properties:
        properties["n"] = {"const": 1, "default": 1, "title": "N"}   # only n=1 is served
    for branch in _branches(properties.get("stop")):
        if branch.get("type") == "string":
            branch.update(_STOP)
        elif branch.get("type") == "array":
            branch.update(maxItems=MAX_STOP_STRINGS, items=_STOP)
    for branch in _branches(properties.get("prompt")):
        if branch.get("type") == "array":
            branch.update(minItems=1, maxItems=1)   # exactly one prompt


def _branches(schema: dict | None) -> list[dict]:
    if schema is None:
        return []
    return schema.get("anyOf", [schema])
