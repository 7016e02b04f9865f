"""Reading a pydantic model's JSON Schema back: the node of one field (whose `description`
is its rule, for a 422's message) and the schema with its definitions inlined (for an OpenAPI
request body, where `#/$defs/...` would not resolve). Used by `tracer/web/probe/schema.py`.

>>> schema = {"properties": {"t": {"$ref": "#/$defs/T"}},
...           "$defs": {"T": {"title": "T", "properties": {"a": {"description": "ms"}}}}}
>>> node_at(schema, ("t", "a")), inlined(schema)
({'description': 'ms'}, {'properties': {'t': {'properties': {'a': {'description': 'ms'}}}}})
"""
from __future__ import annotations


def node_at(schema: dict, loc: tuple) -> dict:
    """The JSON Schema node of the field at `loc` (pydantic's error location) that carries
    its description."""
    node = schema
    for part in loc:
        node = _resolved(schema, node)
        node = node["items"] if isinstance(part, int) else node["properties"][part]
    while "description" not in node:
        inner = _resolved(schema, node, step=True)
        if inner is node:
            break
        node = inner
    return node


def inlined(schema: dict) -> dict:
    """`schema` with every `$ref` replaced by its definition, and no titles."""
    return _inline(schema, schema)


def _inline(schema: dict, node):
    if isinstance(node, list):
        return [_inline(schema, item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline(schema, _definition(schema, node)), **_inline(schema, extra)}
    return {key: ({name: _inline(schema, sub) for name, sub in value.items()}
                  if key == "properties" else _inline(schema, value))
            for key, value in node.items() if key not in ("title", "$defs")}


def _resolved(schema: dict, node: dict, *, step: bool = False) -> dict:
    """`node` through its `$ref` and nullable `anyOf` (one step only with `step`)."""
    while True:
        if "$ref" in node:
            node = _definition(schema, node)
        elif "anyOf" in node:
            node = next(branch for branch in node["anyOf"] if branch.get("type") != "null")
        else:
            return node
        if step:
            return node


def _definition(schema: dict, ref_node: dict) -> dict:
    return schema["$defs"][ref_node["$ref"].rsplit("/", 1)[1]]
