"""The synchronous engine: requests in, one batched step at a time, text deltas out.

nano-vllm's shape: `step()` is schedule → execute → postprocess. The async wrapper runs
the same three calls on its own thread, holding its lock for the first and last only,
so the forward pass never blocks request admission or aborts.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from instrumented_engine.engine.block_manager import BlockManager
from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.cpu_threads import on_short_lived_thread
from instrumented_engine.engine.decode_graphs import CaptureReport, plan_for
from instrumented_engine.engine.device_sync import device_sync_for
from instrumented_engine.engine.errors import EngineInputError
from instrumented_engine.engine.grammar import Grammar, GrammarCompiler
from instrumented_engine.engine.model_runner import ForwardItem, ModelRunner
from instrumented_engine.engine.outputs import RequestOutput
from instrumented_engine.engine.prefill_chunks import report_prefill_chunks
from instrumented_engine.engine.recorder import NoopRecorder, StageRecorder
from instrumented_engine.engine.request_limits import RequestLimits
from instrumented_engine.engine.request_state import RequestState
from instrumented_engine.engine.sampler import Sampler
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.scheduler import Scheduler, SchedulerOutput
from instrumented_engine.engine.sequence import Sequence, SequenceStatus
from instrumented_engine.engine.step_log import StepLog, step_of
from instrumented_engine.engine.warm_up import plan_warm_up
from instrumented_engine.model.chat_prompt import (
    ChatPrompt,
    encode_chat_prompt,
    escape_messages,
)
from instrumented_engine.model.flops import FlopCounter
from instrumented_engine.model.loader import LoadedModel, load_model


class LLMEngine:
    """A Llama-family engine with paged KV cache, prefix caching and continuous batching.

    Not a doctest: it loads the packaged SmolLM2 (seconds)::

        engine = LLMEngine(EngineConfig(device="cpu"))
        prompt = engine.render_chat([{"role": "user", "content": "Hi"}])   # a ChatPrompt
        ids = engine.tokenize(prompt, add_bos=False)     # the rendered template has its BOS
        engine.add_request("r1", ids, SamplingParams(temperature=0, max_tokens=8))
        text = ""
        while engine.has_unfinished():
            for out in engine.step():                    # one RequestOutput per live request
                text += out.text
        # text == 'Hello! How can I assist you today'; out.finish_reason == 'length'
    """

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None,
                 recorder: StageRecorder | None = None,
                 clock_ns: Callable[[], int] = time.perf_counter_ns,
                 device_sync: Callable[[], None] | None = None,
                 model_load_s: float | None = None) -> None:
        """`device_sync` waits for the device at the prefill's end (default: chosen from
        the model's device, `device_sync_for`). `model_load_s` is the load time of a
        `loaded` model read elsewhere; when the engine loads it, it measures it itself."""
        if config.num_threads and str(config.device) in ("cpu", "auto"):
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.clock_ns = clock_ns
        if loaded is None:
            load_start_ns = clock_ns()
            loaded = on_short_lived_thread(lambda: load_model(
                config.model, config.device, config.dtype, config.weight_format))
            model_load_s = (clock_ns() - load_start_ns) / 1e9
        self.loaded = loaded
        self.model_load_s = model_load_s     # None: loaded by someone who did not say how long
        self.warmup_s: float | None = None   # set by `warm_up`
        self.model_name = self.loaded.name
        self.tokenizer = self.loaded.tokenizer
        self.max_model_len = min(config.max_model_len or self.loaded.max_model_len,
                                 self.loaded.max_model_len)
        self.limits = RequestLimits(self.max_model_len, self.tokenizer.max_token_bytes,
                                    config.num_kv_blocks * config.block_size)
        self.max_prompt_bytes = self.limits.max_prompt_bytes
        self.block_manager = BlockManager(config.num_kv_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        # Decode steps as CUDA graphs per bucket, captured by `warm_up` (decode_graphs.py).
        graph_plan, self._graphs_off = plan_for(
            self.loaded.device, config.enforce_eager, config.max_num_seqs,
            min(self.max_model_len, config.num_kv_blocks * config.block_size), config.block_size)
        self.runner = on_short_lived_thread(
            lambda: ModelRunner(self.loaded, config.num_kv_blocks, config.block_size, graph_plan))
        self.sampler = Sampler()
        # JSON-schema grammars for constrained requests (tool calls); built on first use.
        self.grammars = GrammarCompiler(self.tokenizer, self.loaded.config.vocab_size,
                                        self.loaded.eos_token_ids)
        self.recorder: StageRecorder = recorder or NoopRecorder()
        self.steps = StepLog(config.step_log_size)   # what each forward pass computed
        self.device_sync = device_sync or device_sync_for(self.loaded.device)
        self.flops = FlopCounter.of(self.loaded.config)
        self._requests: dict[str, RequestState] = {}

    # -- admission: template → tokenize → kv_lookup ---------------------------------------

    def render_chat(self, messages: list[dict], request_id: str = "") -> ChatPrompt:
        """The chat template's output, with the client's text kept apart from the template's
        special tokens (`instrumented_engine/model/chat_prompt.py`)."""
        escaped, literals = escape_messages(messages, self.tokenizer.special_tokens)
        rendered = self.loaded.chat_template.render(escaped, add_generation_prompt=True)
        self.recorder.template_done(request_id, self.clock_ns())
        return ChatPrompt(rendered, literals)

    def tokenize(self, prompt: str | ChatPrompt, request_id: str = "", *,
                 add_bos: bool | None = None, param: str = "prompt") -> list[int]:
        """`add_bos=None` follows the model; a rendered chat template already has its BOS.
        A plain `str` is the caller's own prompt: its special-token strings are meant. Input
        errors name `param`."""
        self.limits.check_prompt_size(prompt.text if isinstance(prompt, ChatPrompt) else prompt,
                                      param)
        if isinstance(prompt, ChatPrompt):
            token_ids = encode_chat_prompt(self.tokenizer, prompt, add_bos=add_bos)
        else:
            token_ids = self.tokenizer.encode(prompt, add_bos=add_bos)
        self.recorder.tokenize_done(request_id, self.clock_ns(), len(token_ids))
        return token_ids

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling: SamplingParams, grammar: Grammar | None = None) -> Sequence:
        """`grammar`: `sampling.json_schema` compiled already (`self.grammars.compile`, off
        the caller's lock); compiled here when it is not."""
        if request_id in self._requests:
            raise EngineInputError(f"request id {request_id!r} is already running", "request_id")
        self.limits.check_fit(len(prompt_token_ids), sampling)
        if grammar is None and sampling.json_schema is not None:
            grammar = self.grammars.compile(sampling.json_schema)
        seq = Sequence(request_id, prompt_token_ids, sampling, self.config.block_size,
                       arrival_ns=self.clock_ns(), grammar=grammar)
        self._requests[request_id] = RequestState.start(
            seq, self.tokenizer, self.loaded.eos_token_ids, self.loaded.device)
        # The load it arrived into, before it joins the queue: the queueing verdict's evidence.
        num_waiting, num_running = len(self.scheduler.waiting), len(self.scheduler.running)
        hit_tokens = self.scheduler.add(seq)
        self.recorder.kv_lookup_done(request_id, self.clock_ns(), hit_tokens,
                                     hit_tokens // self.config.block_size,
                                     num_waiting, num_running)
        return seq

    def abort(self, request_id: str) -> bool:
        """Finish a request now and free its KV blocks. False if it was not running."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return False
        self._finish_seq(state.seq, SequenceStatus.FINISHED_ABORTED)
        return True

    def _finish_seq(self, seq: Sequence, status: SequenceStatus) -> None:
        # Before the blocks are freed: the prompt's block hashes are still the cache's.
        self.recorder.prompt_blocks(seq.request_id, self.block_manager.prompt_hashes(seq),
                                    seq.token_ids, self.config.block_size)
        self.scheduler.finish(seq, status)

    def fail(self, request_id: str, exc: BaseException,
             seq: Sequence | None = None) -> RequestOutput:
        """Finish a request the engine failed on (finish_reason "error"), free its KV blocks,
        and return the output that tells its reader. Also when the failure struck halfway
        through finishing it (`seq` given, already unregistered): its reader still waits."""
        state = self._requests.pop(request_id, None)
        seq = state.seq if state is not None else seq
        if seq is not None and not seq.is_finished:
            self._finish_seq(seq, SequenceStatus.FINISHED_ERROR)
        counts = ((seq.num_prompt_tokens, seq.num_cached_tokens, seq.num_output_tokens)
                  if seq is not None else (0, 0, 0))
        return RequestOutput(request_id, "", 0, True, "error", *counts,
                             error=f"{type(exc).__name__}: {exc}")

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- one step: schedule → execute → postprocess -------------------------------------

    def step(self) -> list[RequestOutput]:
        plan = self.schedule()
        if not plan.scheduled:
            return []
        return self.postprocess(plan, *self.execute(plan))

    def warm_up(self, *, prompt_tokens: int = 64, decode_steps: int = 3) -> float:
        """Run two made-up requests (`plan_warm_up`) through the step loop before serving, so
        what is built on first use (kernels, allocator and thread pools) is not paid by a
        client's first request; returns the seconds it took (`warmup_s`). Nothing is recorded
        and every KV block is free again afterwards. Call it on an idle engine. Then, on
        CUDA, the decode steps' graphs are captured (`decode_graphs`: not in `warmup_s`)."""
        if self.has_unfinished():
            raise RuntimeError("warm_up needs an idle engine")
        plan = plan_warm_up(
            max_model_len=self.max_model_len, vocab_size=self.loaded.config.vocab_size,
            kv_capacity_tokens=self.config.num_kv_blocks * self.config.block_size,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            prompt_tokens=prompt_tokens, decode_steps=decode_steps)
        recorder, self.recorder = self.recorder, NoopRecorder()
        steps, self.steps = self.steps, StepLog(0)     # made-up requests: no step record
        start_ns = self.clock_ns()
        try:
            for request in plan.requests:
                self.add_request(request.request_id, request.prompt_token_ids, request.sampling)
            for _ in range(plan.max_steps):
                for out in self.step():
                    if out.error is not None:
                        raise RuntimeError(f"the warm-up failed: {out.error}")
                if not self.has_unfinished():
                    break
            else:
                raise RuntimeError(f"the warm-up did not finish in {plan.max_steps} steps")
        finally:
            for request in plan.requests:
                self.abort(request.request_id)   # only when it failed half-way: frees blocks
            self.recorder, self.steps = recorder, steps
        self.warmup_s = (self.clock_ns() - start_ns) / 1e9
        self.runner.capture_decode_graphs()
        return self.warmup_s

    @property
    def decode_graphs(self) -> CaptureReport:
        """Whether decode steps replay CUDA graphs: captured (how many, how long, how much
        memory), pending the warm-up, or off and why."""
        graphs = self.runner.decode_graphs
        return self._graphs_off if graphs is None else graphs.report

    def schedule(self) -> SchedulerOutput:
        plan = self.scheduler.schedule()
        now_ns = self.clock_ns()
        for seq in plan.preempted:
            self.recorder.preempted(seq.request_id, now_ns)
        for seq in plan.first_scheduled:
            self.recorder.scheduled(seq.request_id, now_ns)
        return plan

    def execute(self, plan: SchedulerOutput) -> tuple[torch.Tensor, int, int]:
        """The forward pass; touches no scheduler state, so it may run without the lock."""
        items = [ForwardItem(s.seq.token_ids[s.seq.num_computed_tokens:
                                             s.seq.num_computed_tokens + s.num_new_tokens],
                             s.seq.num_computed_tokens, list(s.seq.block_table), s.want_logits)
                 for s in plan.scheduled]
        start_ns = self.clock_ns()
        logits = self.runner.execute(items)
        # The prefill ends when its logits exist on the device, not when the launches
        # return: without this wait, a GPU's forward time would be stamped as `sample`
        # (docs/architecture.md, "The nine server stages"). A no-op on the CPU.
        self.device_sync()
        return logits, start_ns, self.clock_ns()

    def postprocess(self, plan: SchedulerOutput, logits: torch.Tensor, start_ns: int,
                    end_ns: int) -> list[RequestOutput]:
        # A request aborted while the forward ran has already been finished and freed.
        live = tuple(s for s in plan.scheduled if not s.seq.is_finished)
        report_prefill_chunks(self.recorder, self.flops, plan, live, start_ns, end_ns)
        self._record_step(plan, start_ns, end_ns)
        self.scheduler.on_step_done(dataclasses.replace(plan, scheduled=live))
        picks = self._rows_to_sample(plan)
        if not picks:
            return []
        states = [self._requests[seq.request_id] for _, seq in picks]
        # Only the constrained rows are masked; a batch without one passes None.
        grammars = [(i, st.seq.grammar) for i, st in enumerate(states)
                    if st.seq.grammar is not None] or None
        token_ids = self.sampler.sample_isolated(logits[[row for row, _ in picks]],
                                                 [st.seq.sampling for st in states],
                                                 [st.generator for st in states], grammars)
        sampled_ns = self.clock_ns()
        outputs = []
        for st, token_id in zip(states, token_ids):
            # One sequence's failure (its sampling, its detokenizer) finishes that sequence
            # alone with finish_reason "error"; the rest of the batch goes on.
            if isinstance(token_id, Exception):
                outputs.append(self.fail(st.seq.request_id, token_id, st.seq))
                continue
            try:
                outputs.append(self._append_token(st, token_id, sampled_ns))
            except Exception as exc:  # noqa: BLE001
                outputs.append(self.fail(st.seq.request_id, exc, st.seq))
        return outputs

    @staticmethod
    def _rows_to_sample(plan: SchedulerOutput) -> list[tuple[int, Sequence]]:
        """(logits row, sequence) for each live sequence that reached its last known token."""
        picks, row = [], 0
        for s in plan.scheduled:
            if s.want_logits:
                if not s.seq.is_finished:
                    picks.append((row, s.seq))
                row += 1
        return picks

    def _record_step(self, plan: SchedulerOutput, start_ns: int, end_ns: int) -> None:
        # A method of its own: bench/step_record_cost.py times it and switches it off.
        # Before `on_step_done`: `step_of` reads each chunk's start position.
        step = step_of(plan.scheduled, len(plan.preempted), start_ns, end_ns)
        self.steps.append(step)
        self.recorder.step_done(step.kind, end_ns - start_ns, step.num_batched_tokens)

    def _append_token(self, st: RequestState, token_id: int, sampled_ns: int) -> RequestOutput:
        seq = st.seq
        if seq.num_output_tokens == 0:
            self.recorder.first_token_sampled(seq.request_id, sampled_ns)
        text, status = st.advance(token_id, self.max_model_len)
        if text and not st.has_text:
            st.has_text = True
            self.recorder.first_text(seq.request_id, self.clock_ns(), seq.num_output_tokens)
        if status is not None:
            del self._requests[seq.request_id]
            self._finish_seq(seq, status)
        return RequestOutput(seq.request_id, text, 1, status is not None,
                             seq.status.finish_reason, seq.num_prompt_tokens,
                             seq.num_cached_tokens, seq.num_output_tokens)

    # -- state for gauges ------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_usage_ratio(self) -> float:
        return self.block_manager.usage_ratio
