"""What a response has produced so far, and how it ended: it becomes the request's record
when the response is done, whichever path (streamed or not) produced it. Also what a client
is told when its request ended badly; the details go to the log.

>>> progress = Progress([])
>>> progress.end("abort", "abort"); progress.end("stop", None)   # the first ending stands
>>> progress.finish_reason, progress.error_type
('abort', 'abort')
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tracer.core.request_tracer import ActiveRequest

# What a client is told when the engine fails on its request; the details go to the log.
ENGINE_FAILED = "The engine failed while generating this completion; please retry."
SLOW_READER_ABORTED = ("The stream was aborted: the client stopped reading it "
                       "(docs/architecture.md, \"Through the engine\").")


@dataclasses.dataclass(slots=True)
class Progress:
    """What a response has produced so far; becomes the request's record at the end."""
    text_parts: list[str]
    num_output_tokens: int = 0
    finish_reason: str | None = None
    error_type: str | None = None
    sent_first: bool = False
    finished: bool = False  # the record was handed to the tracer

    def end(self, finish_reason: str, error_type: str | None) -> None:
        """Set how the request ended, unless that is already known."""
        if self.finish_reason is None:
            self.finish_reason, self.error_type = finish_reason, error_type


# Hands a request's record to the tracer, once (`OpenAIServing._finish`): the request, its
# progress, its prompt's token count and how many of those the prefix cache held.
FinishRecord = Callable[[ActiveRequest, Progress, int, int], None]
