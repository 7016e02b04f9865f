"""Attribute maps as OTLP `KeyValue` fields, and the protobuf wire primitives (varint,
length-delimited field) the span encoding (tracer/sinks/otlp_encoding.py) writes with.

Apart from the span's layout because this is where the bytes per value are spent and where
a value can be refused: an attribute the SDK's encoder cannot encode (an int outside int64, a
str with a lone surrogate, a key that is not a str, an unknown type, anywhere inside a
sequence or mapping) is dropped from its span, exactly as the SDK's `_encode_attributes`
drops it, and counted in `EXPORT_DROPS` (docs/reference.md, "Metrics":
`otel_span_attributes_dropped_total`): written as is, one such value would make the whole
`ExportTraceServiceRequest` unparseable (a varint over 10 bytes), losing every span of the
batch. Everything the SDK accepts (NaN, ±inf, -0.0, huge strings, empty sequences) is written
byte for byte as the SDK writes it (tests/tracer/test_otlp_differential.py).
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from tracer.sinks.export_drops import EXPORT_DROPS

_DOUBLE = struct.Struct("<d").pack
# Attribute keys repeat (gen_ai.*, llm.*): their encoded KeyValue.key fields are cached.
_KEYS: dict[str, bytes] = {}
_MAX_CACHED_KEYS = 4096
# AnyValue.int_value is an int64: the SDK's protobuf refuses anything outside.
_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63
_LISTS = (tuple, list)   # Sequences, asked for first: a span's `finish_reasons` is a tuple


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,)) if value >= 0 else _varint(value + (1 << 64))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


def _any_value(value) -> bytes:
    # Order as the SDK's `_encode_value`: bool before int (bool is an int).
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        if not _INT64_MIN <= value < _INT64_END:
            raise ValueError(f"Value out of range: {value}")   # as the SDK's protobuf says
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if value is None:
        return b""
    if type(value) in _LISTS or isinstance(value, Sequence):   # the ABC check is slow
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v))
                                        for k, v in value.items()))
    raise TypeError(f"cannot encode an attribute value of type {type(value).__name__}")


def _key_value(key: str, value) -> bytes:
    encoded_key = _KEYS.get(key)
    if encoded_key is None:
        if len(_KEYS) >= _MAX_CACHED_KEYS:
            _KEYS.clear()
        if isinstance(key, bytes):   # protobuf takes UTF-8 bytes for a string field
            key.decode("utf-8")          # (and refuses the rest, as this raises)
            raw = key
        elif isinstance(key, str):
            raw = key.encode("utf-8")
        else:
            raise TypeError(f"an attribute key must be a str, got {type(key).__name__}")
        # An empty key is proto3's default string: left out, as the SDK's bytes leave it.
        encoded_key = _KEYS[key] = _field(b"\x0a", raw) if raw else b""
    kind = type(value)   # the common kinds first, without the isinstance ladder
    if kind is str:
        encoded = value.encode("utf-8")
        n = len(encoded)
        value_field = (bytes((0x12, n + 2, 0x0a, n)) + encoded if n < 0x7E
                       else _field(b"\x12", _field(b"\x0a", encoded)))
    elif kind is int and 0 <= value < _INT64_END:
        encoded = _varint(value)
        value_field = bytes((0x12, len(encoded) + 1, 0x18)) + encoded
    elif kind is float:
        value_field = b"\x12\x09\x21" + _DOUBLE(value)
    else:
        value_field = _field(b"\x12", _any_value(value))
    return encoded_key + value_field


# Prefixes of the common attribute values, by length or value: no `bytes(...)` per value.
_LEN = [bytes((n,)) for n in range(0x80)]                       # a one-byte length
_STR_HEAD = [bytes((0x12, n + 2, 0x0a, n)) for n in range(0x7E)]   # AnyValue.string_value
_SMALL_INT = [bytes((0x12, 2, 0x18, v)) for v in range(0x80)]      # AnyValue.int_value < 128
_INT_HEAD = [bytes((0x12, n + 1, 0x18)) for n in range(11)]       # a varint of n bytes
_FLOAT_HEAD = b"\x12\x09\x21"


def _attributes(tag: bytes, attributes) -> bytes:
    """The `KeyValue` fields of `attributes`, each under `tag`. The common case (a key seen
    before; a str, an int in 0 ... 2^63 or a float) is written here in parts, joined once;
    the rest by `_key_value`. The same bytes either way."""
    if not attributes:
        return b""
    out = []
    append = out.append
    keys = _KEYS
    for k, v in attributes.items():
        try:
            encoded_key = keys.get(k)
            kind = type(v)
            if encoded_key is not None and kind is str:
                payload = v.encode("utf-8")
                m = len(payload)
                if m < 0x7E:
                    head = _STR_HEAD[m]
                else:
                    head, payload = _field(b"\x12", _field(b"\x0a", payload)), b""
            elif encoded_key is not None and kind is int and 0 <= v < _INT64_END:
                if v < 0x80:
                    head, payload = _SMALL_INT[v], b""
                else:
                    payload = _varint(v)
                    head = _INT_HEAD[len(payload)]
            elif encoded_key is not None and kind is float:
                head, payload = _FLOAT_HEAD, _DOUBLE(v)
            else:
                kv = _key_value(k, v)
                n = len(kv)
                append(tag)
                append(_LEN[n] if n < 0x80 else _varint(n))
                append(kv)
                continue
        except Exception:   # noqa: BLE001 — what the SDK's `_encode_attributes` catches
            EXPORT_DROPS.attribute_dropped()
            continue
        n = len(encoded_key) + len(head) + len(payload)
        append(tag)
        append(_LEN[n] if n < 0x80 else _varint(n))
        append(encoded_key)
        append(head)
        append(payload)
    return b"".join(out)
