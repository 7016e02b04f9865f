"""schemathesis CLI hooks for test_schemathesis.py (loaded through `SCHEMATHESIS_HOOKS`): the
engine generates real tokens, so a generated completion's token budget is capped right
before it is sent (the fuzzing is of the request surface, not of generation length)."""
from __future__ import annotations

import schemathesis

MAX_TOKENS = 3


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[field] = MAX_TOKENS
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS
