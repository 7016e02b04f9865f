"""The range a request's token counts must fall in to be believed: 0 … 10^7 (ten million
tokens: the longest context windows served today, ~10M, fit; 2^63 − 1 or 1e308 does not).

Counts arrive from places we do not control: an engine span's `gen_ai.usage.*`, an upstream's
`usage` object, llama.cpp's `timings`, TGI's headers. All of them reach a `RequestRecord`, and
the record checks them as it is built (`RequestRecord.__post_init__`): a count out of range,
or not an int, becomes 0 ("not reported", which every sink already handles) and the value as
sent is kept, cut to 32 characters, in `attrs["llm.invalid_tokens.<kind>"]`. The metrics
count those in `llm_invalid_token_counts_total{kind}` (docs/reference.md, "Metrics"). So a
counter never takes a negative step (which raises) nor an infinite one.
"""
from __future__ import annotations

MAX_TOKENS_PER_REQUEST = 10**7
# The record attribute holding an answer's reasoning tokens, where its usage said
# (docs/architecture.md, "First output, by kind").
REASONING_TOKENS_ATTR = "llm.usage.reasoning_tokens"
# The closed `kind` label of `llm_invalid_token_counts_total`, in the record's field order.
TOKEN_KINDS = ("prompt", "cached", "output")
INVALID_ATTR = "llm.invalid_tokens."
_MAX_KEPT_CHARS = 32


def checked_counts(counts: tuple, attrs: dict) -> tuple[int, int, int] | None:
    """`counts` (prompt, cached, output) when all are valid (None: nothing to change); else
    the counts with each invalid one as 0, its value as sent marked in `attrs`.

    >>> checked_counts((5, 0, 7), {}) is None
    True
    >>> attrs = {}; checked_counts((2**63 - 1, 0, -1), attrs), attrs
    ((0, 0, 0), {'llm.invalid_tokens.prompt': '9223372036854775807', 'llm.invalid_tokens.output': '-1'})
    """
    prompt, cached, output = counts
    # Spelled out, not `all(...)` over a generator: this runs for every record, on the
    # finishing thread (docs/figures.md, "The tracer's own cost").
    if (type(prompt) is int and type(cached) is int and type(output) is int
            and 0 <= prompt <= MAX_TOKENS_PER_REQUEST and 0 <= cached <= MAX_TOKENS_PER_REQUEST
            and 0 <= output <= MAX_TOKENS_PER_REQUEST):
        return None
    out = []
    for kind, n in zip(TOKEN_KINDS, counts):
        if type(n) is int and 0 <= n <= MAX_TOKENS_PER_REQUEST:
            out.append(n)
        else:
            attrs[INVALID_ATTR + kind] = _shown(n)
            out.append(0)
    return out[0], out[1], out[2]


def invalid_kinds(attrs: dict) -> list[str]:
    """The kinds `checked_counts` marked invalid in a record's `attrs`."""
    return [kind for kind in TOKEN_KINDS if INVALID_ATTR + kind in attrs]


def _shown(value) -> str:
    try:
        return str(value)[:_MAX_KEPT_CHARS]
    except ValueError:   # an int past Python's int → str digit limit (4,300 digits)
        return f"int of {value.bit_length()} bits"
