"""The closed vocabulary of TTFT causes: what a verdict may say, and the change it names.

Every verdict (`tracer.record.verdict`) names one of these causes, and every metric label,
span attribute, log field, UI sentence, alert and runbook section takes its name from here
(docs/architecture.md, "Diagnosis"; docs/reference.md, "Runbook"). Each cause states the
signals its rule reads, the evidence it reports (numbers, by key) and the action: the knob
to turn on vLLM, SGLang, llama.cpp's llama-server and our engine.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Cause:
    name: str                       # the label value: a closed set, never a user string
    title: str                      # a few words for the UI sentence and the alert text
    signals: tuple[str, ...]        # what the rule reads (record fields and baselines)
    evidence: tuple[str, ...]       # the numbers a verdict of this cause reports, by key
    actions: dict[str, str]         # engine -> the change to make
    actionable: bool = True         # has an alert and a runbook section of its own
    # Its rule compares the request with the model's history (tracer/record/baselines.py):
    # until the series it reads holds MIN_SAMPLES values it cannot say "above normal", and a
    # request it could not judge is `unjudged`, never `healthy`. False: it fires from the
    # model's first request (an event, a token count, the neighbours' measured blame).
    needs_baseline: bool = False
    # What of it still fires with no history, for a rule that otherwise needs one.
    without_baseline: str = ""

    def __post_init__(self) -> None:
        # Every verdict names the history it was judged against (HISTORY_EVIDENCE).
        if HISTORY_EVIDENCE[0] not in self.evidence:
            object.__setattr__(self, "evidence", self.evidence + HISTORY_EVIDENCE)

    def action(self) -> str:
        """One line naming the knob on each engine, for logs, spans and the UI."""
        return "; ".join(f"{engine}: {knob}" for engine, knob in self.actions.items())


# The history a finding was judged against: the number of values in the baseline series its
# excess was measured against (at most the window, 256), or None when it read none: a rule
# that needs no baseline, or one that fired on what needs none (waiting requests, the
# neighbours' blame). Every cause's evidence ends with it.
HISTORY_EVIDENCE = ("baseline_samples",)

# What a queueing or slow-prefill verdict adds once the neighbours are known
# (tracer/record/neighbours.py): how many requests its wait was behind, and the ones that
# account for most of it, the first as scalars (span attributes take scalars only). None
# where nothing overlapped, or no neighbourhood was asked (docs/architecture.md, "Neighbours").
CULPRIT_EVIDENCE = ("num_neighbours", "culprit_trace_id", "culprit_share", "culprit_phase",
                    "culprit_prompt_tokens", "culprits")
# The action when the culprit is a long prompt's prefill: cap its chunk so shorter prompts
# start beside it (vLLM's --long-prefill-token-threshold; SGLang and llama.cpp have only the
# chunk size, so their knob is a smaller chunk).
BEHIND_LONG_PREFILL_ACTIONS = {
    "vLLM": "set --long-prefill-token-threshold, so a long prompt's chunk per step is capped "
            "and shorter prompts are prefilled beside it",
    "SGLang": "lower --chunked-prefill-size, so a long prompt's chunks leave room in each step",
    "llama.cpp": "lower -b / -ub, so a long prompt's batches interleave with the other slots",
    "ttftscope engine": "turn on or lower --long-prefill-token-threshold (256 by default, 0 "
                        "is off), so a long prompt's chunk leaves more of each step to "
                        "shorter prompts"}

# Engines, in the order the action line names them.
ENGINES = ("vLLM", "SGLang", "llama.cpp", "ttftscope engine")

QUEUEING = Cause(
    "queueing", "waited for a batch slot",
    ("queue stage", "queue baseline", "waiting and running requests at arrival"),
    ("queue_stage", "queue_ms", "normal_queue_ms", "num_waiting_at_arrival",
     "num_running_at_arrival") + CULPRIT_EVIDENCE,
    {"vLLM": "raise --max-num-seqs, or add replicas",
     "SGLang": "raise --max-running-requests, or add replicas",
     "llama.cpp": "raise -np (parallel slots)",
     "ttftscope engine": "raise --max-num-seqs"},
    needs_baseline=True,
    without_baseline="requests waiting at arrival; or, with the engine's step record, most "
                     "of the TTFT spent behind other requests' work (the neighbours' blame)")
LONG_PROMPT = Cause(
    "long_prompt", "an uncached prompt far longer than usual",
    ("prompt and cached tokens", "usual uncached prompt length", "prefill ms per token"),
    ("uncached_tokens", "usual_uncached_tokens", "prefill_ms"),
    {"vLLM": "lower --max-num-batched-tokens so its prefill is chunked, or cap the prompt",
     "SGLang": "lower --chunked-prefill-size, or cap the prompt",
     "llama.cpp": "lower -ub (physical batch), or cap the prompt",
     "ttftscope engine": "lower --max-num-batched-tokens, or cap the prompt"},
    needs_baseline=True)
PREFIX_CACHE_MISS = Cause(
    "prefix_cache_miss", "a prefix-cache miss on a shared prompt",
    ("the share of this prompt's text seen in a recent prompt", "cached tokens",
     "prefill ms per token"),
    ("shared_fraction", "cached_tokens", "prompt_tokens", "cacheable_tokens",
     "shared_with_trace_id"),
    {"vLLM": "keep the shared text at the start of the prompt and anything per-request "
             "(timestamps, ids) after it; --enable-prefix-caching",
     "SGLang": "keep per-request text after the shared prefix (RadixAttention is on "
               "unless --disable-radix-cache)",
     "llama.cpp": "keep per-request text after the shared prefix (--cache-reuse only "
                  "skips text removed or moved, never changed)",
     "ttftscope engine": "keep per-request text after the shared prefix; drop "
                         "--no-prefix-caching"})
SLOW_PREFILL = Cause(
    "slow_prefill", "prefill slow for its length",
    ("prefill ms per uncached token", "its baseline", "prefill chunks' batch sizes"),
    ("prefill_ms", "expected_prefill_ms", "prefill_ms_per_token",
     "normal_prefill_ms_per_token", "uncached_tokens", "max_batch_size") + CULPRIT_EVIDENCE,
    {"vLLM": "lower --max-num-batched-tokens (less decode interference per step), or "
             "move load off the host",
     "SGLang": "lower --chunked-prefill-size, or --schedule-policy lpm; move load off the host",
     "llama.cpp": "lower -np or -ub; give llama-server its own cores (-t)",
     "ttftscope engine": "lower --max-num-batched-tokens; give the engine its own cores "
                         "(--num-threads)"},
    needs_baseline=True,
    without_baseline="with the engine's step record, most of the TTFT spent behind other "
                     "requests' work (the neighbours' blame)")
CPU_PREPROCESSING = Cause(
    "cpu_preprocessing", "CPU-bound preprocessing before the engine",
    ("receive, template, tokenize and kv_lookup stages", "their baselines"),
    ("preprocess_ms", "normal_preprocess_ms", "slowest_stage"),
    {"vLLM": "more API server processes (--api-server-count), or a faster tokenizer",
     "SGLang": "--tokenizer-worker-num, or --skip-tokenizer-init with pre-tokenized input",
     "llama.cpp": "give the server's HTTP threads cores (--threads-http)",
     "ttftscope engine": "run more engine processes behind a balancer; keep prompts' "
                         "templates small"},
    needs_baseline=True)
NETWORK = Cause(
    "network", "the network between the browser and the server",
    ("client TTFT minus server TTFT", "its baseline"),
    ("client_ttft_ms", "server_ttft_ms", "network_ms", "normal_network_ms"),
    {"vLLM": "serve from a region near the users; keep connections warm (HTTP keep-alive)",
     "SGLang": "serve from a region near the users; keep connections warm",
     "llama.cpp": "serve from a region near the users; keep connections warm",
     "ttftscope engine": "serve from a region near the users; keep connections warm"})
BUFFERING = Cause(
    "buffering", "an intermediary held the stream back",
    ("the probe's buffering verdict", "client chunk arrivals"),
    ("client_ttft_ms", "network_ms", "held_back_ms", "buffered_chunks"),
    {"vLLM": "turn buffering and compression off for text/event-stream at the proxy "
             "(nginx: proxy_buffering off; gzip off)",
     "SGLang": "turn buffering and compression off for text/event-stream at the proxy",
     "llama.cpp": "turn buffering and compression off for text/event-stream at the proxy",
     "ttftscope engine": "turn buffering and compression off for text/event-stream at the "
                         "proxy (the engine sends X-Accel-Buffering: no)"})
FIRST_PRINTABLE_LATE = Cause(
    "first_printable_late", "the first token was not yet printable",
    ("tokens generated before the first printable text", "detokenize stage"),
    ("tokens_before_text", "detokenize_ms"),
    {"vLLM": "nothing to tune: a byte-level token held part of a character (CJK, emoji); "
             "judge TTFT by the first printable text, as this does",
     "SGLang": "nothing to tune: the first token held part of a character",
     "llama.cpp": "nothing to tune: the first token held part of a character",
     "ttftscope engine": "nothing to tune: the first token held part of a character"},
    actionable=False)
COLD_PATH = Cause(
    "cold_path", "a cold path after start or idle",
    ("requests seen since start", "idle time before this request"),
    ("requests_since_start", "idle_s"),
    {"vLLM": "warm up after start (send a request before marking the pod ready); keep "
             "CUDA graphs on (no --enforce-eager)",
     "SGLang": "warm up before marking ready (the server's own warm-up request is on unless "
               "--skip-server-warmup)",
     "llama.cpp": "send a warm-up request before marking ready; --mlock keeps the weights "
                  "resident",
     "ttftscope engine": "keep the warm-up (no --no-warmup); send traffic before marking "
                         "ready"},
    actionable=False)
PREEMPTED = Cause(
    "preempted", "preempted and recomputed",
    ("preemption events",),
    ("num_preemptions", "prefill_ms"),
    {"vLLM": "raise --gpu-memory-utilization or lower --max-num-seqs",
     "SGLang": "raise --mem-fraction-static or lower --max-running-requests",
     "llama.cpp": "raise -c (context size) per slot or lower -np",
     "ttftscope engine": "raise --num-kv-blocks or lower --max-num-seqs"},
    actionable=False)
THINKING = Cause(
    "thinking", "the model thought longer than usual before answering",
    ("the reasoning segment (first thinking to the first text)", "its baseline",
     "reasoning tokens, where the usage says"),
    ("reasoning_ms", "normal_reasoning_ms", "reasoning_tokens"),
    {"vLLM": "lower the request's reasoning effort (`reasoning_effort`, Responses "
             "`reasoning.effort`), or turn thinking off for turns that need none "
             "(`chat_template_kwargs` with `enable_thinking` false, on Qwen3-style templates)",
     "SGLang": "lower `reasoning_effort`, or set `enable_thinking` false in "
               "`chat_template_kwargs` for turns that need no thinking",
     "llama.cpp": "cap thinking with --reasoning-budget (0 turns it off), or per request "
                  "set `enable_thinking` false in `chat_template_kwargs`",
     "ttftscope engine": "nothing to tune: it serves no reasoning model (the hosted APIs' "
                         "knobs: OpenAI `reasoning_effort`, Anthropic `thinking.budget_tokens`, "
                         "Gemini `thinkingConfig.thinkingBudget`, Ollama `think`)"},
    # No alert of its own: how long a model may think is a product choice made per model
    # with the knobs above; the TTFT alert and the verdict name it when it grows.
    actionable=False,
    # A reasoning model always thinks: only its own usual think says what is too long.
    needs_baseline=True)
SLOW_KV_TRANSFER = Cause(
    "slow_kv_transfer", "a KV cache transfer slow for its length",
    ("the kv_transfer stage (prefill/decode disaggregation)", "its ms per prompt token",
     "their baseline"),
    ("kv_transfer_ms", "expected_kv_transfer_ms", "prompt_tokens"),
    {"vLLM": "put the NixlConnector's transfer on RDMA (UCX_TLS and UCX_NET_DEVICES naming "
             "the RDMA devices, not TCP), and keep prefill and decode instances on one fabric",
     "SGLang": "use an RDMA transfer backend (--disaggregation-transfer-backend mooncake or "
               "nixl) with --disaggregation-ib-device set, and keep prefill and decode "
               "workers on one fabric",
     "llama.cpp": "nothing to tune: llama-server does not disaggregate prefill and decode",
     "ttftscope engine": "nothing to tune: it does not disaggregate prefill and decode"},
    needs_baseline=True)
# The whole path (tracer/collect/path_verdict.py): the user's own service, not an engine,
# so the change is the same whichever engine serves.
_BACKEND_ACTION = ("speed up the named span in your service, or take it off the request's "
                   "critical path (run it beside the engine call, or after the first token)")
BACKEND = Cause(
    "backend", "your backend's own work before the engine call",
    ("the backend segments on the whole path's critical path", "each segment's baseline"),
    ("segment", "segment_ms", "normal_segment_ms", "span_id", "service"),
    dict.fromkeys(("vLLM", "SGLang", "llama.cpp", "ttftscope engine"), _BACKEND_ACTION),
    needs_baseline=True)
# Every rule judged the request and none fired: it was within what is normal, which only a
# baseline can say.
HEALTHY = Cause("healthy", "nothing above normal", (), (), {}, actionable=False,
                needs_baseline=True)
# No rule fired, and a rule that applies had too little history to judge (its series below
# MIN_SAMPLES): not healthy, not a cause. The sentence says how much history there is.
UNJUDGED = Cause("unjudged", "not judged, too little history",
                 ("the baselines' sample counts",),
                 ("min_samples", "unjudged_causes"), {}, actionable=False)

CAUSES: tuple[Cause, ...] = (
    QUEUEING, LONG_PROMPT, PREFIX_CACHE_MISS, SLOW_PREFILL, CPU_PREPROCESSING, NETWORK,
    BUFFERING, FIRST_PRINTABLE_LATE, COLD_PATH, PREEMPTED, THINKING, SLOW_KV_TRANSFER, BACKEND,
    HEALTHY, UNJUDGED)
CAUSE_NAMES: tuple[str, ...] = tuple(c.name for c in CAUSES)
CAUSE_BY_NAME: dict[str, Cause] = {c.name: c for c in CAUSES}
# Causes the server decides from its own record; the rest need the browser's beacon.
CLIENT_CAUSES: tuple[str, ...] = (NETWORK.name, BUFFERING.name)
# The outcomes that name no cause: ranked last, never a gate's or an alert's top cause, and
# never drawn as one (/ui, the dashboards' cause panels).
NO_CAUSE: tuple[str, ...] = (HEALTHY.name, UNJUDGED.name)
