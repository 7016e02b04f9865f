"""What the engine hands back after each step, per request."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class RequestOutput:
    """One step's news for one request: printable text since the last output, and counts.

    `text` may be empty (a half UTF-8 character or a possible stop-string prefix is held back).
    """

    request_id: str
    text: str
    num_new_tokens: int
    finished: bool
    finish_reason: str | None       # stop | length | abort | error, once finished
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    error: str | None = None        # with finish_reason "error": what failed, for the logs
