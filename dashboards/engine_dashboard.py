"""The engine dashboard: load, KV cache, prefix-cache hits, throughput, decode latency, engine
steps, GPU.

The panels that explain a TTFT change: requests waiting (queue), KV cache usage and prefix
hits (kv_lookup, prefill), tokens/s (prefill load), and the forward passes by step kind
(a decode stalled by a prefill). GPU panels stay empty without a GPU.

>>> engine_dashboard().uid
'engine'
"""
from __future__ import annotations

from grafanalib import core as g

from panels import (
    Cell, dashboard, dashboard_links, place, quantile, rate,
    right_axis, sel, targets, threshold_line, timeseries, variables,
)
from tracer.record.stages import STEP_KINDS

UID = "engine"
# TPOT p90 / p50 above this is drawn red: one in ten requests decodes at half the typical
# speed or worse.
TPOT_SPREAD_RED = 2.0
TTFT = "gen_ai_server_time_to_first_token_seconds"
# One colour per step kind (tracer/record/stages.py, STEP_KINDS) in the three step panels,
# so a kind reads the same across them.
STEP_KIND_COLORS = dict(zip(STEP_KINDS, ("purple", "orange", "green"), strict=True))


def load_panel() -> g.TimeSeries:
    return timeseries(
        "Requests running and waiting",
        "Running: sequences in the current batch. Waiting: admitted but not yet scheduled; "
        "they are the queue stage of TTFT. Waiting above zero for long means the engine is "
        "saturated: add replicas, lower load, or raise max_num_seqs/max_num_batched_tokens "
        "if memory allows.",
        targets(("running", f"sum ({sel('llm_requests_running')})"),
                ("waiting", f"sum ({sel('llm_requests_waiting')})")),
        unit="short")


def kv_cache_panel() -> g.TimeSeries:
    return timeseries(
        "KV cache usage",
        "Share of paged KV blocks in use, per instance. Near 100% new requests wait for "
        "blocks (queue grows) or get preempted: raise num_kv_blocks or lower max_model_len.",
        targets(("{{instance}}", f"max by (instance) ({sel('llm_kv_cache_usage_ratio')})")),
        unit="percentunit", valueMin=0, valueMax=1, **{
            "thresholds": [{"color": "transparent", "value": None},
                           {"color": "red", "value": 0.9}],
            "thresholdsStyleMode": "dashed"})


def prefix_cache_panel() -> g.TimeSeries:
    hit_ratio = (f"sum ({rate('llm_prompt_cached_tokens_total')})\n  /\n"
                 f"sum ({rate('llm_prompt_tokens_total')})")
    return timeseries(
        "Prefix-cache hit ratio vs TTFT p95",
        "Share of prompt tokens served from the prefix cache (left) next to server TTFT p95 "
        "(right). Hits skip prefill, so a falling ratio with rising TTFT means prompts stopped "
        "sharing prefixes (a changed system prompt, or cache evictions: see KV usage).",
        targets(("prefix-cache hit ratio", hit_ratio),
                ("TTFT p95", quantile(0.95, TTFT))),
        unit="percentunit", overrides=[right_axis("TTFT p95", "s")])


def tokens_panel() -> g.TimeSeries:
    return timeseries(
        "Prompt and generation tokens/s",
        "Prompt tokens/s is the prefill load, of which the cached part skipped prefill; "
        "generation tokens/s is decode throughput. Prompt tokens/s rising with TTFT means "
        "longer prompts, not a slower engine.",
        targets(("prompt", f"sum ({rate('llm_prompt_tokens_total')})"),
                ("prompt (from cache)", f"sum ({rate('llm_prompt_cached_tokens_total')})"),
                ("generation", f"sum ({rate('llm_generation_tokens_total')})")),
        unit="short", axisLabel="tokens/s")


def finish_reasons_panel() -> g.TimeSeries:
    return timeseries(
        "Finished requests by reason",
        "stop: the model ended; length: max_tokens hit; abort: the client went away (often "
        "users giving up on a slow first token); error: look at the server logs.",
        targets(("{{finish_reason}}",
                 f"sum by (finish_reason) ({rate('llm_requests_total')})")),
        unit="reqps", stacking={"mode": "normal", "group": "A"}, fillOpacity=40)


def itl_panel() -> g.TimeSeries:
    itl = "llm_inter_token_latency_seconds"
    return timeseries(
        "Inter-token latency",
        "Gap between streamed chunks after the first. High ITL with a good TTFT means decode "
        "is slow: big batches (lower max_num_seqs) or long prefills interleaving (chunked "
        "prefill budget).",
        targets(*[(f"p{q}", quantile(q / 100, itl)) for q in (50, 95, 99)]), unit="s")


def tpot_panel() -> g.TimeSeries:
    tpot = "gen_ai_server_time_per_output_token_seconds"
    # The spread is the recording rule's (p90 / p50 over 5 m), so the panel and any rule on
    # it read the same number.
    spread = ('llm:tpot_p90_over_p50:ratio_5m{model=~"$model", instance=~"$instance"}')
    spread_style = [{"id": "custom.axisPlacement", "value": "right"},
                    {"id": "unit", "value": "x"},
                    {"id": "custom.thresholdsStyle", "value": {"mode": "dashed"}},
                    {"id": "thresholds", "value": {"mode": "absolute", "steps": [
                        {"color": "transparent", "value": None},
                        {"color": "red", "value": TPOT_SPREAD_RED}]}}]
    return timeseries(
        "Time per output token, and its spread",
        "(last token - first token) / (tokens - 1) per request: the decode speed a user "
        "reads at, p50/p90/p99, and the spread p90 / p50 (right axis, 5-minute window: 1 = "
        "every request streams alike, 2 = one in ten at half the typical speed). Red: the "
        f"spread above the dashed {TPOT_SPREAD_RED:g}x line means some requests decode far "
        "slower than the typical one: large or uneven batches (lower max_num_seqs), long "
        "prefills interleaving with decode (chunked-prefill budget), or preemption when the "
        "KV cache is full. All percentiles up together: the engine is slower overall (GPU "
        "clocks, CPU starvation).",
        targets(*[(f"p{q}", quantile(q / 100, tpot)) for q in (50, 90, 99)],
                ("spread p90/p50 {{instance}} {{model}}", spread)),
        unit="s", overrides=[{"matcher": {"id": "byRegexp", "options": "^spread "},
                              "properties": spread_style}])


def stream_gap_panel() -> g.TimeSeries:
    gap = "llm_stream_max_gap_seconds"
    return timeseries(
        "Largest gap inside a stream",
        "Per request, the longest pause between two streamed chunks after the first: what a "
        "reader experiences as the text freezing. p50/p95/p99 over requests. Red: above the "
        "dashed 1 s line a visible stall; a p99 far above the inter-token p99 means rare long "
        "pauses, typically preemption (KV cache full: raise num_kv_blocks), a long prefill of "
        "another request blocking the step (chunked prefill), or a blocked event loop (see "
        "CPU and event-loop lag).",
        targets(*[(f"p{q}", quantile(q / 100, gap)) for q in (50, 95, 99)], exemplar=True),
        unit="s", **threshold_line(1.0))


def cpu_panel() -> g.TimeSeries:
    lag = "llm_event_loop_lag_seconds"
    lag_p99 = "event-loop lag p99"
    return timeseries(
        "CPU and event-loop lag",
        "CPU seconds the process uses per second (left: 1 = one core busy) and the p99 delay "
        "of the server's event loop waking up (right). The seeds' 'high TTFT, idle GPU' case: "
        "Red: lag above the dashed 50 ms line delays every request's receive and send stages "
        "and the tokenizer; with CPU pinned at the container's core limit the process is "
        "starved: give it more cores, move tokenization off the loop, or lower concurrency.",
        targets(("CPU cores busy {{instance}}",
                 f"sum by (instance) ({rate('process_cpu_seconds_total')})"),
                (lag_p99, quantile(0.99, lag))),
        unit="short", overrides=[{**right_axis(lag_p99, "s"), "properties": [
            *right_axis(lag_p99, "s")["properties"],
            {"id": "custom.thresholdsStyle", "value": {"mode": "dashed"}},
            {"id": "thresholds", "value": {"mode": "absolute", "steps": [
                {"color": "transparent", "value": None}, {"color": "red", "value": 0.05}]}}]}])


def duration_panel() -> g.TimeSeries:
    duration = "gen_ai_server_request_duration_seconds"
    failed = 'error_type!=""'
    return timeseries(
        "Request duration and errors",
        "End-to-end server time per request (p50/p95), and failed requests/s by error type "
        "(right axis). Errors rising: check the logs for the error type shown.",
        targets(("p50", quantile(0.5, duration)),
                ("p95", quantile(0.95, duration)),
                ("errors: {{error_type}}", "sum by (error_type) ("
                 f"{rate(f'{duration}_count', failed)})")),
        unit="s", overrides=[{
            "matcher": {"id": "byRegexp", "options": "^errors: .*"},
            "properties": [{"id": "custom.axisPlacement", "value": "right"},
                           {"id": "unit", "value": "reqps"}]}])


def _step_kind_colors() -> list[dict]:
    """Overrides colouring every series whose legend starts with a step kind."""
    return [{"matcher": {"id": "byRegexp", "options": f"^{kind} "},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}]}
            for kind, color in STEP_KIND_COLORS.items()]


def step_time_panel() -> g.TimeSeries:
    # The recording rules' quantiles (recording.yml), per instance, model and kind.
    queries = targets(*[(f"{{{{kind}}}} p{q} {{{{instance}}}} {{{{model}}}}",
                         sel(f"llm:engine_step_seconds:p{q}_5m")) for q in (50, 95)])
    dashed = {"matcher": {"id": "byRegexp", "options": "^[a-z]+ p95 "},
              "properties": [{"id": "custom.lineStyle",
                              "value": {"fill": "dash", "dash": [10, 10]}}]}
    return timeseries(
        "Engine step time by kind (p50/p95)",
        "Time of one engine forward pass, p50 (solid) and p95 (dashed) over 5 minutes, by "
        "step kind: decode (only running sequences, one token each), mixed (decode "
        "sequences and prompt tokens in one pass) and prefill (prompt tokens only, nothing "
        "decoding). Decode and mixed step times are the gaps between the tokens of every "
        "running stream. A decode stalled by a prefill shows as mixed steps taking far "
        "longer than decode steps: lower the prompt tokens a step may carry "
        "(--max-num-batched-tokens, --long-prefill-token-threshold) so decodes are not held "
        "behind a long chunk. All kinds slower together: the engine itself is slower (batch "
        "size, CPU, GPU clocks).",
        queries, unit="s", overrides=[*_step_kind_colors(), dashed])


def tokens_per_step_panel() -> g.TimeSeries:
    return timeseries(
        "Tokens per step by kind",
        "Mean tokens one forward pass computes (prompt tokens + decode sequences, like "
        "vLLM's iteration tokens), by step kind, over 5 minutes. Decode: the batch size, "
        "one token per running sequence. Mixed and prefill: the prompt chunk plus any decode "
        "batch, at most --max-num-batched-tokens (decodes are scheduled first). Read with "
        "step time: mixed steps near the token budget and much slower than decode steps mean "
        "prompt chunks set the pace of every stream; small decode batches with requests "
        "waiting mean the scheduler is not filling the batch (max_num_seqs, KV blocks).",
        targets(("{{kind}} {{instance}} {{model}}", sel("llm:engine_step_tokens:mean_5m"))),
        unit="short", axisLabel="tokens/step", overrides=_step_kind_colors())


def steps_per_second_panel() -> g.TimeSeries:
    share = "share mixed or prefill"
    return timeseries(
        "Steps per second by kind",
        "Engine forward passes per second by step kind (5-minute rates), and the share of "
        "steps that carry prompt tokens, mixed or prefill (right axis). A busy engine steps "
        "continuously, so fewer steps per second at the same load means longer steps. A "
        "rising share of mixed steps while TPOT or the largest stream gap grows means "
        "decodes share their passes with prefills; step time by kind says what that costs "
        "them. Steps are taken only while there is work: an idle engine shows zero steps "
        "per second and no share.",
        targets(("{{kind}} {{instance}} {{model}}", sel("llm:engine_steps:rate5m")),
                (f"{share} {{{{instance}}}} {{{{model}}}}",
                 sel("llm:engine_steps_with_prefill:ratio_rate5m"))),
        unit="short", axisLabel="steps/s", overrides=[
            *_step_kind_colors(),
            {"matcher": {"id": "byRegexp", "options": f"^{share} "},
             "properties": [{"id": "custom.axisPlacement", "value": "right"},
                            {"id": "unit", "value": "percentunit"},
                            {"id": "min", "value": 0}, {"id": "max", "value": 1}]}])


def gpu_panel(title: str, metrics: tuple[str, ...], unit: str, description: str) -> g.TimeSeries:
    queries = targets(*[(f"{{{{instance}}}} gpu {{{{gpu}}}} {metric.removeprefix('llm_gpu_')}",
                         sel(metric)) for metric in metrics])
    return timeseries(title, description + " Empty without an NVIDIA GPU (NVML absent), by "
                      "design; per GPU index, not per model.", queries, unit=unit)


def gpu_panels() -> list[Cell]:
    return [
        Cell(gpu_panel("GPU utilization", ("llm_gpu_utilization_ratio",), "percentunit",
                       "Share of time a kernel ran. Low while requests wait: the engine is "
                       "CPU- or scheduler-bound, not GPU-bound."), 8),
        Cell(gpu_panel("GPU memory", ("llm_gpu_memory_used_bytes", "llm_gpu_memory_total_bytes"),
                       "bytes", "Device memory in use (weights + KV cache + activations) and "
                       "installed. Used near total: lower num_kv_blocks or max_num_seqs."), 8),
        Cell(gpu_panel("GPU power", ("llm_gpu_power_watts",), "watt",
                       "Board power draw; at the power limit clocks drop and prefill slows."), 8),
    ]


def engine_dashboard() -> g.Dashboard:
    rows = [
        (8, [Cell(load_panel(), 8), Cell(kv_cache_panel(), 8), Cell(prefix_cache_panel(), 8)]),
        (8, [Cell(tokens_panel(), 12), Cell(finish_reasons_panel(), 12)]),
        (8, [Cell(itl_panel(), 12), Cell(tpot_panel(), 12)]),
        (8, [Cell(step_time_panel(), 8), Cell(tokens_per_step_panel(), 8),
             Cell(steps_per_second_panel(), 8)]),
        (8, [Cell(stream_gap_panel(), 12), Cell(cpu_panel(), 12)]),
        (8, [Cell(duration_panel(), 24)]),
        (7, gpu_panels()),
    ]
    count = "llm_requests_total"
    return dashboard(
        UID, "LLM engine",
        "Load, KV cache, prefix-cache hits, throughput, decode latency, engine steps by kind "
        "and GPU of the instrumented engine: the context for a TTFT change.",
        place(rows),
        variables(f"label_values({count}, model)",
                  f'label_values({count}{{model=~"$model"}}, instance)'),
        dashboard_links())
