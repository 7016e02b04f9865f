"""How much of a prompt's text a recent prompt shared: the evidence of a prefix-cache miss.

A prefix cache hashes a prompt's blocks in a chain, each hash covering every token before
it, so one changed token near the start (a timestamp at the top of the system prompt)
makes every later block miss although the text is the same. The chain cannot show that;
content hashes that do not depend on position can. A prompt is cut into pieces at line
breaks (a line longer than `PIECE_CHARS` into pieces of that size) and each piece is hashed
on its own; the share of the prompt's characters whose pieces also occur in one recent
prompt of the same model is `shared_fraction` (docs/architecture.md, "Diagnosis").

Line pieces survive a change of length on an earlier line, which fixed-size blocks would
not. A shared text that differs inside every line (rare in a system prompt) is not seen
as shared: the rule then stays silent rather than guessing.

The text never leaves the process: only Python's (per-process salted) string hashes are
kept: `MAX_PIECES` per prompt, and `RECENT_PIECES` per model. `FingerprintCache` keeps the
pieces of recent long message parts (a system prompt every request repeats is cut and hashed
once, not per request), keyed by the part's own hash and length, never by its text.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

PIECE_CHARS = 256
MIN_PIECE_CHARS = 8        # blank and tiny lines ("", "}", "---") say nothing
MAX_PIECES = 1024          # per prompt: 256 kB of text in pieces; the rest is not compared
# A request body over this is not compared. Fronts hand the prompt over by reference (the
# proxy its raw body, never the parsed objects, up to ten times larger), and a record waits
# in the tracer's worker queue (up to 4,096 records), or parked for its engine's span, until
# it is judged: this bounds what each can hold on to, and is ~16k tokens of prompt.
MAX_PROMPT_SOURCE_BYTES = 64 << 10
# The request fields that hold a prompt: OpenAI chat (`messages`), completions (`prompt`),
# Responses (`input`) and Anthropic Messages (`system`, `messages`).
PROMPT_KEYS = ("system", "messages", "prompt", "input")
# Pieces remembered per model: 32 prompts of 128 lines (a system prompt is tens of lines).
RECENT_PIECES = 4096
# FingerprintCache: a message part this long or longer has its pieces kept (a shorter one is
# cut and hashed as fast as it is looked up), and the pieces kept in all before the cache
# starts again (~64 parts of a 2 kB system prompt at 40 lines each; ~0.3 MB).
MIN_CACHED_PART_CHARS = 256
MAX_CACHED_PIECES = 1 << 14


@dataclass(slots=True, frozen=True)
class Fingerprint:
    pieces: dict[int, int]      # piece hash -> its characters, over every occurrence
    num_chars: int              # characters of the prompt's text (all of it)


@dataclass(slots=True, frozen=True)
class Overlap:
    shared_fraction: float      # of this prompt's characters, found in `trace_id`'s prompt
    trace_id: str               # the recent request that shared them


def prompt_text(source: object) -> str:
    """The text of a prompt as a front saw it: a string, (nested) lists of chat messages,
    their content as a string or as parts, or a raw JSON request body (bytes), whose
    `PROMPT_KEYS` fields are read; a body that is not a JSON object has no text.

    >>> prompt_text([None, [{"role": "system", "content": "be brief"},
    ...              {"role": "user", "content": [{"type": "text", "text": "hi"}]}]])
    'be brief\\nhi'
    >>> prompt_text(b'{"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}')
    'be brief\\nhi'
    """
    return "\n".join(prompt_parts(source))


def prompt_parts(source: object) -> list[str]:
    """The strings `prompt_text` joins with line breaks, in order: each message's content or
    text part. A list of strings is its own parts.

    >>> prompt_parts([{"role": "system", "content": "be brief"}, "hi"])
    ['be brief', 'hi']
    """
    if isinstance(source, (bytes, bytearray)):
        source = _body_prompt(source)
    parts: list[str] = []
    _collect(source, parts, depth=0)
    return parts


def _body_prompt(body: bytes) -> object:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return [obj.get(key) for key in PROMPT_KEYS] if isinstance(obj, dict) else None


def _collect(value: object, parts: list[str], depth: int) -> None:
    if depth > 8:
        return
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, list):
        for item in value:
            _collect(item, parts, depth + 1)
    elif isinstance(value, dict):
        for key in ("content", "text"):
            if key in value:
                _collect(value[key], parts, depth + 1)


def fingerprint(text: str) -> Fingerprint:
    """The prompt's pieces, hashed.

    >>> fp = fingerprint("2026-12-03 05:00\\n" + "You are a helpful assistant.\\n" * 3)
    >>> len(fp.pieces), fp.num_chars
    (2, 104)
    """
    pieces: dict[int, int] = {}
    _add_pieces(pieces, text)
    return Fingerprint(pieces, len(text))


def _add_pieces(pieces: dict[int, int], text: str) -> None:
    """`text`'s pieces added to `pieces`, until it holds `MAX_PIECES`."""
    get = pieces.get
    for line in text.split("\n"):
        n = len(line)
        if n < MIN_PIECE_CHARS:
            continue
        if n <= PIECE_CHARS:          # most lines: one piece, no slicing
            key = hash(line)
            pieces[key] = get(key, 0) + n   # a repeated line counts twice
        else:
            for start in range(0, n, PIECE_CHARS):
                piece = line[start:start + PIECE_CHARS]
                if len(piece) >= MIN_PIECE_CHARS:
                    key = hash(piece)
                    pieces[key] = get(key, 0) + len(piece)
        if len(pieces) >= MAX_PIECES:
            break


class FingerprintCache:
    """`fingerprint(prompt_text(source))`, with the pieces of each long message part kept for
    the next prompt that repeats it: a shared system prompt costs a dict lookup (its hash,
    which Python computes once per string, and its length), not a cut and a hash per line.
    The same result as `fingerprint` always (tests/tracer/test_prompt_overlap.py compares
    them): parts are joined with line breaks, so the prompt's lines are its parts' lines, in
    order; where the pieces reach `MAX_PIECES`, the prompt is cut the long way.

    >>> cache = FingerprintCache()
    >>> source = [{"role": "system", "content": "You are helpful.\\n" * 40}, "hi there, you"]
    >>> cache.of(source) == fingerprint(prompt_text(source)) == cache.of(source)
    True
    """

    def __init__(self, max_pieces: int = MAX_CACHED_PIECES) -> None:
        self.max_pieces = max_pieces
        self._parts: dict[tuple[int, int], dict[int, int]] = {}   # (len, hash) -> pieces
        self._num_pieces = 0

    def of(self, source: object) -> Fingerprint:
        parts = prompt_parts(source)
        if not parts:
            return Fingerprint({}, 0)
        pieces: dict[int, int] = {}
        get = pieces.get
        for part in parts:
            if len(part) < MIN_CACHED_PART_CHARS:
                _add_pieces(pieces, part)
            else:
                for key, n in self._pieces_of(part).items():
                    pieces[key] = get(key, 0) + n
            if len(pieces) >= MAX_PIECES:
                # The cap falls inside this prompt: where exactly, only the long way says.
                return fingerprint("\n".join(parts))
        return Fingerprint(pieces, sum(map(len, parts)) + len(parts) - 1)

    def _pieces_of(self, part: str) -> dict[int, int]:
        key = (len(part), hash(part))
        found = self._parts.get(key)
        if found is None:
            found = fingerprint(part).pieces
            if self._num_pieces + len(found) > self.max_pieces:
                self._parts.clear()     # start again: no per-entry eviction on this path
                self._num_pieces = 0
            self._parts[key] = found
            self._num_pieces += len(found)
        return found


class RecentPrompts:
    """The pieces of one model's recent prompts, each with the newest prompt that held it,
    and the best overlap of a new prompt with one of them.

    An index by piece rather than a list of prompts: a query costs one dict read per piece
    of the new prompt, however many prompts are remembered. A prompt's overlap is credited
    to the newest prompt holding each piece; the best is the prompt credited with the most
    characters. At most `max_pieces` pieces are remembered: past it, the least recently
    seen half is forgotten.

    >>> recent = RecentPrompts()
    >>> system = "You are the support agent of Example Corp. Answer politely.\\n" * 4
    >>> recent.add("a" * 32, fingerprint("Time: 05:00:01\\n" + system + "hi"))
    >>> o = recent.best_overlap(fingerprint("Time: 05:00:02\\n" + system + "bye"))
    >>> round(o.shared_fraction, 2), o.trace_id == "a" * 32
    (0.91, True)
    """

    def __init__(self, max_pieces: int = RECENT_PIECES) -> None:
        self.max_pieces = max_pieces
        # A plain dict in recency order (a re-seen piece is popped and put back at the end):
        # with int keys and str values the garbage collector never tracks it (an
        # OrderedDict is always tracked), and its order is all an LRU needs here.
        self._newest: dict[int, str] = {}   # piece hash -> trace id

    def add(self, trace_id: str, fp: Fingerprint) -> None:
        newest = self._newest
        for key in fp.pieces:
            newest.pop(key, None)
            newest[key] = trace_id
        if len(newest) > self.max_pieces:
            # Forget the older half at once: amortised O(1) a piece, no per-piece eviction.
            keep = self.max_pieces // 2
            self._newest = dict(itertools.islice(newest.items(), len(newest) - keep, None))

    def best_overlap(self, fp: Fingerprint) -> Overlap | None:
        """The recent prompt sharing the most characters with `fp` (the newest holder of a
        piece gets it), or None when none shares any."""
        if not fp.pieces or not fp.num_chars:
            return None
        credit: dict[str, int] = {}
        newest = self._newest
        for key, chars in fp.pieces.items():
            trace_id = newest.get(key)
            if trace_id is not None:
                credit[trace_id] = credit.get(trace_id, 0) + chars
        if not credit:
            return None
        trace_id = max(credit, key=credit.__getitem__)
        return Overlap(min(credit[trace_id] / fp.num_chars, 1.0), trace_id)
