"""A request's prompt as a chain of keyed block digests: what the Mooncake export's `hash_ids`
are made of (docs/reference.md, "Trace export (Mooncake JSONL)").

A chain is `bytes`, 8 bytes per block of the prompt, block i's digest covering every block
up to i (so equal digest i means an equal prefix through block i). At most `MAX_BLOCKS`
blocks (128 Ki tokens at 16 a block): a record's chain is at most 64 KiB, typically
~1 KiB (2,000 tokens), kept in one `bytes` object (33 bytes of overhead) rather than a
tuple of ints (~40 bytes a block).

Every digest is keyed with `PROCESS_KEY`, random per process: a digest of a guessed
prompt cannot be matched against a log line, so neither the log nor the export can be
reversed into text, and chains from two processes never share a digest. The export then
maps digests to small integers in first-seen order, so what leaves is only the equality
structure.

Three sources, all hashed here on the tracer's worker, never on a request's thread:
- our engine with prefix caching: its own chained block hashes (`BlockManager.commit`
  computed them for the cache; no new hashing of tokens), each re-keyed;
- our engine without prefix caching: the prompt's token ids, chained in 16-token blocks;
- the proxy: the prompt's text, chained in `DEFAULT_CHARS_PER_BLOCK`-character blocks, the
  measured equivalent of 16 tokens (tokens are unknown there).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from array import array
from collections.abc import Sequence

DIGEST_BYTES = 8
MAX_BLOCKS = 8192
# The block the chain is recorded in: our engine's and vLLM's default KV block size.
TOKENS_PER_BLOCK = 16
# Characters of the prompt text the proxy puts in one block, as close to 16 tokens of
# SmolLM2's tokenizer as measured on chat prompts (docs/reference.md, "Trace export
# (Mooncake JSONL)"; bench/chars_per_block.py reproduces it).
DEFAULT_CHARS_PER_BLOCK = 64

PROCESS_KEY = secrets.token_bytes(16)
# Keyed once: copying the keyed state costs less than keying each digest anew.
_KEYED = hashlib.blake2b(key=PROCESS_KEY, digest_size=DIGEST_BYTES)

# The window `/ui/api/export?minutes=N` and `trace export --minutes` take.
MAX_EXPORT_MINUTES = 7 * 24 * 60
DEFAULT_EXPORT_MINUTES = 60


def _digest(data: bytes) -> bytes:
    keyed = _KEYED.copy()
    keyed.update(data)
    return keyed.digest()


def from_engine_hashes(hashes: Sequence[int]) -> bytes:
    """The engine's chained block hashes (64-bit ints), each keyed: already a chain.

    >>> len(from_engine_hashes([1, -2, 3])), from_engine_hashes([5]) == from_engine_hashes([5])
    (24, True)
    """
    return b"".join(_digest((h & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
                    for h in hashes[:MAX_BLOCKS])


def from_tokens(token_ids: Sequence[int], block_size: int = TOKENS_PER_BLOCK) -> bytes:
    """The full `block_size`-token blocks of `token_ids`, chained (the tail is left out, as
    the engine's cache leaves it).

    >>> a, b = from_tokens(range(40), 16), from_tokens([*range(16), 7, *range(17, 40)], 16)
    >>> len(a) // 8, a[:8] == b[:8], a[8:] == b[8:]
    (2, True, False)
    """
    return _chain((array("q", token_ids[i:i + block_size]).tobytes()
                   for i in range(0, min(len(token_ids) // block_size, MAX_BLOCKS) * block_size,
                                  block_size)))


def from_text(text: str, chars_per_block: int = DEFAULT_CHARS_PER_BLOCK) -> bytes:
    """The full `chars_per_block`-character blocks of `text`, chained.

    >>> len(from_text("x" * 130, 64)) // 8
    2
    """
    return _chain((text[i:i + chars_per_block].encode("utf-8", "surrogatepass")
                   for i in range(0, min(len(text) // chars_per_block, MAX_BLOCKS)
                                  * chars_per_block, chars_per_block)))


def _chain(blocks) -> bytes:
    out, prev = [], b""
    for block in blocks:
        prev = _digest(prev + block)
        out.append(prev)
    return b"".join(out)


def encode(chain: bytes) -> str:
    """The chain as the log line and /ui/api/export carry it: base64."""
    return base64.b64encode(chain).decode("ascii")


def decode(text: object) -> bytes:
    """The inverse of `encode`; ValueError when `text` is not one."""
    if not isinstance(text, str):
        raise ValueError("prompt_blocks is not a string")
    try:
        chain = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("prompt_blocks is not base64") from None
    if len(chain) % DIGEST_BYTES or len(chain) > MAX_BLOCKS * DIGEST_BYTES:
        raise ValueError(f"prompt_blocks holds {len(chain)} bytes: not a chain of "
                         f"{DIGEST_BYTES}-byte digests of at most {MAX_BLOCKS} blocks")
    return chain


def export_fields(record) -> dict:
    """What the export needs of a record, in the log line and /ui/api/export alike."""
    return {"arrival_unix_ms": record.arrival_unix_ms,
            "prompt_blocks": encode(record.block_chain)}
