"""The fuzzers' token budget: the engine generates real tokens, so a generated completion's
budget is capped right before it is sent (the fuzzing is of the request surface, not of
generation length). Shared by test_schemathesis.py's in-process runs and the schemathesis
CLI's hook (schemathesis_hooks.py)."""
from __future__ import annotations

MAX_TOKENS = 3


def cap_generation(body) -> None:
    """Cap a request body's `max_tokens` / `max_completion_tokens` in place (or set one)."""
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[field] = MAX_TOKENS
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS
