"""The finished record of one request: what metrics, spans, logs and the store consume."""
from __future__ import annotations

from dataclasses import dataclass, field

from tracer.record.emits import NO_GAPS, GapSummary
from tracer.record.token_counts import checked_counts

# Draft tokens of one request past which a count is not one (the token counts' own bound).
MAX_DRAFT_TOKENS = 10**7


@dataclass(slots=True, frozen=True)
class StageSpan:
    """One attributed stage on the server's perf_counter timeline."""

    stage: str
    start_ns: int
    end_ns: int
    attrs: dict = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


_new = object.__new__
_SET_STAGE, _SET_START, _SET_END, _SET_ATTRS = (
    StageSpan.stage.__set__, StageSpan.start_ns.__set__, StageSpan.end_ns.__set__,
    StageSpan.attrs.__set__)


def stage_span(stage: str, start_ns: int, end_ns: int, attrs: dict) -> StageSpan:
    """`StageSpan(stage, start_ns, end_ns, attrs)`, built without the frozen dataclass'
    `__init__` (its four `object.__setattr__` calls): the request thread's attribution makes
    nine a request. The same object; `attrs` is taken, not copied.

    >>> stage_span("queue", 1, 5, {}) == StageSpan("queue", 1, 5, {})
    True
    """
    span = _new(StageSpan)
    _SET_STAGE(span, stage)
    _SET_START(span, start_ns)
    _SET_END(span, end_ns)
    _SET_ATTRS(span, attrs)
    return span


@dataclass(slots=True, frozen=True)
class ToolCall:
    """One tool call of a response: the function's name (cut to 64 characters; never its
    arguments), and when it started and when its arguments were complete, in ns from the
    request's start (ready None when the stream ended first)."""

    name: str | None
    start_ns: int
    ready_ns: int | None


@dataclass(slots=True)
class RequestRecord:
    """Everything known about one finished request. Times are perf_counter_ns.

    `stages` is contiguous and in pipeline order for a request that produced a token, and
    ends at its first output of any kind; then come the output segments, if any
    (`tracer.record.output_segments`), up to the first text. `unattributed_ns` is the part of
    TTFT no stage covers (zero for our engine).
    """

    request_id: str
    trace_id: str           # 32 lowercase hex
    span_id: str            # 16 lowercase hex: the `chat {model}` span
    model: str              # a served model name, never a raw request string
    operation: str          # "chat" | "text_completion"
    start_ns: int           # receive start
    end_ns: int             # last byte handed to the transport
    stages: tuple[StageSpan, ...] = ()
    unattributed_ns: int = 0
    ttft_ns: int | None = None          # to the first text; None when no text was ever sent
    first_output_ns: int | None = None  # to the first output of any kind (the stages' end)
    first_output_kind: str | None = None   # OUTPUT_KINDS: text, reasoning or tool_call
    tool_calls: tuple[ToolCall, ...] = ()  # the first MAX_TOOL_CALLS calls, in start order
    num_tool_calls: int = 0             # every call, the ones not kept too
    itl: GapSummary = NO_GAPS           # gaps between emitted content chunks (bounded)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    # Speculative decoding, as the engine reported it (llama.cpp's `timings.draft_n` and
    # `draft_n_accepted`): tokens the draft proposed and the target accepted; 0, 0 without.
    num_draft_tokens: int = 0
    num_draft_accepted: int = 0
    finish_reason: str = "stop"         # stop | length | abort | error
    error_type: str | None = None
    source: str = "engine"              # engine | proxy
    events: tuple[tuple[str, int, dict], ...] = ()   # (name, t_ns, attrs), e.g. prefill chunks
    attrs: dict = field(default_factory=dict)        # gen_ai.request.* and the like
    client: dict | None = None          # joined probe beacon, once one arrives
    # The TTFT verdict (a tracer.record.verdict.Verdict), set off the request's thread by
    # the diagnosis before the metrics, spans and log line see the record; None until then.
    verdict: object = None
    # The prompt as the front saw it (chat messages, a string or a raw JSON body), only for
    # the diagnosis' overlap check, which drops it: never exported, never kept.
    prompt_source: object = field(default=None, repr=False, compare=False)
    # For the trace export (tracer/record/block_chain.py), set on the tracer's worker:
    # when the request arrived (unix ms), and its prompt's chain of keyed 8-byte block
    # digests, one per 16 tokens (at most 64 KiB, typically ~1 KiB).
    arrival_unix_ms: int | None = None
    block_chain: bytes = b""
    # What the engine reported of the prompt's blocks (its hashes or token ids), until the
    # worker turns it into `block_chain` and drops it.
    block_source: object = field(default=None, repr=False, compare=False)
    # What the span starter returned at `begin` (opaque here): the span sink finishes it.
    span_handle: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Every source of token counts ends here: out of range → 0, marked in attrs.
        fixed = checked_counts((self.num_prompt_tokens, self.num_cached_tokens,
                                self.num_output_tokens), self.attrs)
        if fixed is not None:
            self.num_prompt_tokens, self.num_cached_tokens, self.num_output_tokens = fixed
        if not 0 <= self.num_draft_accepted <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            # An engine cannot accept more than was drafted: both are then unknown.
            self.num_draft_tokens = self.num_draft_accepted = 0

    @property
    def e2e_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def tpot_ns(self) -> int | None:
        """(last − first) / (n − 1) over emitted chunks, as docs/architecture.md defines it."""
        return None if self.ttft_ns is None else self.itl.mean_ns

    @property
    def draft_acceptance(self) -> float | None:
        """Accepted / drafted tokens of speculative decoding; None when nothing was drafted.

        >>> RequestRecord("r", "0" * 32, "0" * 16, "m", "chat", 0, 1, num_draft_tokens=8,
        ...               num_draft_accepted=6).draft_acceptance
        0.75
        >>> RequestRecord("r", "0" * 32, "0" * 16, "m", "chat", 0, 1, num_draft_tokens=2,
        ...               num_draft_accepted=3).draft_acceptance is None
        True
        """
        return self.num_draft_accepted / self.num_draft_tokens if self.num_draft_tokens else None

    def stage_ns(self, stage: str) -> int | None:
        for s in self.stages:
            if s.stage == stage:
                return s.duration_ns
        return None
