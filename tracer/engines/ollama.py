"""Ollama's timing, in-band: the durations on the final line of `/api/chat` and `/api/generate`.

Read from ollama/ollama at two commits (no code taken):

- `api/types.go` @b8761ab020a91873a4f27e6008deeace9b2d101f, `Metrics` (embedded in
  `ChatResponse` and `GenerateResponse`): `total_duration`, `load_duration`,
  `prompt_eval_count`, `prompt_eval_duration`, `eval_count`, `eval_duration`, each
  `omitempty`. The durations are Go `time.Duration`s, which encode as JSON integers of ns.
- `server/routes.go` @24fbbbbc12bd0c42aa4b2c0d7db9facd51f9ec92, `GenerateHandler` (and the
  chat handler alike): `checkpointStart` when the handler starts, `checkpointLoaded` once
  `scheduleRunner` returned a runner; `load_duration` = loaded − start, set only when `Done`.
  So it is the scheduler's wait for a runner: the model's load when it was not resident
  (a cold load), near zero when it was. The prompt is templated and tokenized after it, and
  `prompt_eval_duration` comes from the runner's completion: the prefill.

No arrival stamp: `model_load` and `prefill` are placed against our first content
(`end_anchored`, docs/architecture.md, "Inside the engine"), as llama.cpp's `timings` are;
what lies between them (templating, tokenizing) stays in `upstream_other`.
`eval_duration` and `eval_count` are the decode, not a stage; `eval_count` is the output
token count, `prompt_eval_count` the prompt's evaluated tokens.
"""
from __future__ import annotations

from tracer.engines.timing import EngineTiming, nanos_ns, token_count

LOAD = "load_duration"
PREFILL = "prompt_eval_duration"
PROMPT_TOKENS = "prompt_eval_count"
OUTPUT_TOKENS = "eval_count"
DECODE = "eval_duration"
# The final line's fields the proxy keeps (the line may also carry `context`, a token list
# as long as the conversation: never kept).
FIELDS = (LOAD, PREFILL, PROMPT_TOKENS, OUTPUT_TOKENS, DECODE, "total_duration")


def matches(final: dict | None) -> bool:
    """A final line with a usable load or prompt-evaluation duration; one whose fields are
    missing or hostile is no signal.

    >>> matches({"load_duration": 5}), matches({}), matches({"prompt_eval_duration": -1}), matches(None)
    (True, False, False, False)
    """
    return isinstance(final, dict) and (nanos_ns(final.get(LOAD)) is not None
                                        or nanos_ns(final.get(PREFILL)) is not None)


def timing_of(final: dict) -> EngineTiming:
    """Each field through the bounded converters: negative, NaN, a string, a bool or over a
    day is unknown (None), never a stage.

    >>> t = timing_of({"load_duration": 2_000_000_000, "prompt_eval_duration": 30_000_000,
    ...                "prompt_eval_count": 26, "eval_count": 290})
    >>> t.source, t.model_load_ns, t.prefill_ns, t.ttft_ns, t.num_prompt_tokens
    ('ollama', 2000000000, 30000000, 2030000000, 26)
    >>> t = timing_of({"load_duration": "1", "prompt_eval_duration": float("nan")})
    >>> t.model_load_ns, t.prefill_ns, t.ttft_ns
    (None, None, None)
    """
    load, prefill = nanos_ns(final.get(LOAD)), nanos_ns(final.get(PREFILL))
    known = [ns for ns in (load, prefill) if ns is not None]
    return EngineTiming("ollama", model_load_ns=load, prefill_ns=prefill,
                        ttft_ns=sum(known) if known else None,
                        num_prompt_tokens=token_count(final.get(PROMPT_TOKENS)))
