"""A Mooncake trace (JSONL) read for replay, and the prompts and length fields it becomes.

The format (docs/reference.md, "Trace replay"; Mooncake's `FAST25-release` traces, read by
aiperf's `mooncake_trace` dataset type and Dynamo's data generator): one JSON object a line,
`timestamp` (ms from the first request), `input_length` and `output_length` (tokens) and
`hash_ids`, one integer per block of the prompt, where equal ids mean an equal prefix.

Prompts are built from blocks: the same hash id always gives the same text, `block_size`
words long. Every word of `tracer.bench.prompts._WORDS` is one token after a space in
SmolLM2's tokenizer and each block starts with a space, so on SmolLM2 a block is exactly
`block_size` tokens and block boundaries stay token boundaries (measured for 2,000 blocks of
16 words; the docs section above). On other tokenizers a block is about `block_size` tokens.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from tracer.bench.prompts import _WORDS

__all__ = ["SERVER_KINDS", "TraceRequest", "block_text", "length_fields", "load_trace",
           "prompt_text", "repeated_prefix_blocks"]

# What each kind of server accepts for "exactly output_length tokens" (docs/reference.md,
# "Supported request options"): our engine refuses `min_tokens` other than 0 with a 400, so
# it gets `ignore_eos` alone (which already makes max_tokens exact there); vLLM and SGLang take
# both; llama-server honours `ignore_eos` (docs/reference.md, "llama.cpp server"); a plain
# OpenAI-compatible server gets max_tokens only, and the output may then be shorter.
SERVER_KINDS: dict[str, dict] = {
    "ttftscope": {"ignore_eos": True},
    "vllm": {"ignore_eos": True, "min_tokens": True},
    "llama-server": {"ignore_eos": True},
    "openai": {},
}
REPLAY_ENDPOINTS = ("completions", "chat")


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One line of the trace; `line` is its 1-based line number (the request's identity)."""

    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(obj: dict, name: str, where: str, minimum: int) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def parse_line(text: str, line: int) -> TraceRequest:
    where = f"line {line}"
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a JSON object")
    timestamp = obj.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) \
            or not math.isfinite(timestamp) or timestamp < 0:
        raise ValueError(f"{where}: timestamp must be a number of ms >= 0, got {timestamp!r}")
    hash_ids = obj.get("hash_ids", [])
    if not isinstance(hash_ids, list) or any(
            isinstance(h, bool) or not isinstance(h, int) for h in hash_ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    if "text_input" in obj or "input_text" in obj:
        # aiperf's exact-payload variant: not replayed here rather than silently synthesised.
        raise ValueError(f"{where}: text_input is not supported; give input_length and hash_ids")
    return TraceRequest(line, float(timestamp), _int_field(obj, "input_length", where, 1),
                        _int_field(obj, "output_length", where, 1), tuple(hash_ids))


def load_trace(path: str | Path, block_size: int = 16) -> list[TraceRequest]:
    """The trace's requests in send order (by timestamp, then line). A request whose
    hash_ids need more tokens than its input_length holds is refused: its blocks could not
    all be sent, so the sharing the trace describes would be lost without a word."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    requests = []
    with open(path, encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            if text.strip():
                requests.append(parse_line(text, number))
    if not requests:
        raise ValueError(f"{path}: no requests")
    for r in requests:
        if (len(r.hash_ids) - 1) * block_size >= r.input_length:
            raise ValueError(f"line {r.line}: {len(r.hash_ids)} hash_ids of {block_size} tokens "
                             f"do not fit input_length {r.input_length}; is --block-size "
                             "the trace's?")
    return sorted(requests, key=lambda r: (r.timestamp_ms, r.line))


def block_text(hash_id: int, num_words: int, seed: int = 0) -> str:
    """The text of block `hash_id`: its first `num_words` of a fixed word sequence, so a
    short last block is a prefix of the full block of the same id."""
    rng = random.Random(f"{seed}:block:{hash_id}")
    return "".join(" " + rng.choice(_WORDS) for _ in range(num_words))


def prompt_text(request: TraceRequest, block_size: int = 16, seed: int = 0) -> str:
    """input_length words: its blocks in order (the last one cut to fit), then, past the
    last hash id, words of its own (seeded by its line) that no other request shares."""
    pieces, left = [], request.input_length
    for hash_id in request.hash_ids:
        take = min(block_size, left)
        pieces.append(block_text(hash_id, take, seed))
        left -= take
    if left > 0:
        rng = random.Random(f"{seed}:unique:{request.line}")
        pieces.append(f" #{request.line}" + "".join(" " + rng.choice(_WORDS)
                                                    for _ in range(left - 1)))
    return "".join(pieces)


def length_fields(server: str, endpoint: str, output_length: int) -> dict:
    """The body fields asking for exactly `output_length` tokens, as `server` accepts them."""
    if server not in SERVER_KINDS:
        raise ValueError(f"server must be one of {sorted(SERVER_KINDS)}, got {server!r}")
    if endpoint not in REPLAY_ENDPOINTS:
        raise ValueError(f"replay supports --endpoint {' or '.join(REPLAY_ENDPOINTS)}, "
                         f"not {endpoint!r}")
    kind = SERVER_KINDS[server]
    fields: dict = {"max_tokens": output_length}
    if kind.get("ignore_eos"):
        fields["ignore_eos"] = True
    if kind.get("min_tokens"):
        fields["min_tokens"] = output_length
    return fields


def request_body(request: TraceRequest, *, model: str, endpoint: str, server: str,
                 block_size: int = 16, seed: int = 0) -> dict:
    """The streaming body: completions send the blocks as the raw prompt (block i of the
    text is block i of the engine's KV); chat sends them as one user message, behind the
    chat template's header, so its blocks sit a few tokens later."""
    body = {"model": model, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True},
            **length_fields(server, endpoint, request.output_length)}
    text = prompt_text(request, block_size, seed)
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def repeated_prefix_blocks(requests: list[TraceRequest]) -> list[int]:
    """For each request (in the given order), how many of its leading hash ids an earlier
    request already had: the most blocks a prefix cache could hold for it."""
    seen: set[int] = set()
    counts = []
    for r in requests:
        n = 0
        while n < len(r.hash_ids) and r.hash_ids[n] in seen:
            n += 1
        counts.append(n)
        seen.update(r.hash_ids)
    return counts
