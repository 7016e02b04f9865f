"""Beacon tokens: proof that a beacon comes from the browser the response was sent to.

The server signs each response's trace id, `token = hex(HMAC-SHA256(key, trace_id))` (the
trace id as its 32 ASCII hex digits), and sends it in the `Server-Timing` header next to the
trace context (`beacon;desc=<token>`). Only the browser that received that response can read
it, and it returns it in the beacon's `token` field; `/v1/probe` (or a standalone collector
given the same key) recomputes it and compares in constant time. Without it, anyone who
learns a trace id could post first and rewrite that request's client timings (the first
beacon for a trace wins). docs/architecture.md, "Afterwards: the browser's beacon".

The key comes from `--beacon-key` / `TTFTSCOPE_BEACON_KEY`; when unset, each process draws
a random one, which is enough when the beacons come back to the process that served them.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

TOKEN_HEX_CHARS = 64
_TOKEN = re.compile(r"[0-9a-f]{64}")


class BeaconSigner:
    """Signs and checks beacon tokens with one key.

    >>> signer = BeaconSigner(b"k" * 32)
    >>> token = signer.token("4bf92f3577b34da6a3ce929d0e0e4736")
    >>> len(token), signer.verify("4bf92f3577b34da6a3ce929d0e0e4736", token)
    (64, True)
    >>> signer.verify("4bf92f3577b34da6a3ce929d0e0e4737", token), signer.verify("4bf9" * 8, None)
    (False, False)
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or not key:
            raise ValueError("a beacon key is a non-empty byte string")
        self._key = key

    @classmethod
    def from_setting(cls, key: str | bytes | None) -> "BeaconSigner":
        """The configured key (a str is taken as UTF-8), or a random 32-byte one."""
        if key is None or key == "" or key == b"":
            return cls(secrets.token_bytes(32))
        return cls(key.encode("utf-8") if isinstance(key, str) else key)

    def token(self, trace_id: str) -> str:
        # hmac.new, not the one-shot hmac.digest: that one releases the GIL (tracer/record/ids.py).
        return hmac.new(self._key, trace_id.encode("ascii"), hashlib.sha256).hexdigest()

    def verify(self, trace_id: str, token: str | None) -> bool:
        """True when `token` is this key's token for `trace_id` (constant-time compare)."""
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            return False
        return hmac.compare_digest(self.token(trace_id), token)

    def sign(self, data: bytes) -> str:
        """base64url (no padding) of HMAC-SHA256(key, data): the `sig` of the in-band timing
        token (tracer/web/inband.py). Never equal to `token`'s input space: `token` signs 32
        hex digits, `sign` a base64url JSON payload (it starts with `eyJ`).

        >>> len(BeaconSigner(b"k").sign(b"eyJ2IjoxfQ"))
        43
        """
        return base64.urlsafe_b64encode(
            hmac.new(self._key, data, hashlib.sha256).digest()).rstrip(b"=").decode("ascii")

    def verify_signature(self, data: bytes, sig: str) -> bool:
        """True when `sig` is `sign(data)` (constant-time compare)."""
        return isinstance(sig, str) and hmac.compare_digest(self.sign(data).encode("ascii"),
                                                            sig.encode("ascii", "replace"))

    def __repr__(self) -> str:   # never print the key
        return "BeaconSigner(<key>)"
