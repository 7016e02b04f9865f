"""AsyncEngine: the engine's step loop on its own thread, requests as async iterators.

Threads: a small pool renders the template and tokenizes a long prompt (CPU work that would
otherwise stall every other request on the event loop, /health included; a short one is
prepared on the asyncio thread, cheaper than the hand-off); the asyncio thread admits
requests (prefix lookup included) under `_lock`; the step thread holds `_lock` only to
schedule and to postprocess, never during the forward pass. Outputs cross back with one
`call_soon_threadsafe` per step, not per token.

With `warm_up`, the step thread first runs `LLMEngine.warm_up` and only then serves;
until it is done, `warming_up` is true and `submit` refuses with `EngineWarmingUpError`.

Each request's outputs wait for their reader in a bounded `RequestStream`
(`instrumented_engine/engine/request_stream.py`): a reader that falls too far behind has its
request aborted and its KV blocks freed.

A failure is kept to the request it belongs to: a sequence whose sampling or detokenizing
fails finishes with finish_reason "error" (`LLMEngine.postprocess`); a forward pass that
fails is rerun one sequence at a time, so only the sequence that breaks it alone fails.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from instrumented_engine.engine.errors import EngineRequestError
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.outputs import RequestOutput
from instrumented_engine.engine.request_stream import MAX_PENDING_OUTPUTS, RequestStream
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.scheduler import SchedulerOutput

log = logging.getLogger(__name__)

# Threads that render and tokenize. Few: each is CPU-bound, and the step thread needs cores.
NUM_PREPARE_THREADS = 2
# A prompt this short is prepared on the event loop: that takes ~0.1 ms for a typical chat,
# about what the hand-off to a pool thread costs (measured ~80 µs median on 2 vCPUs), and up
# to ~1 ms of the loop at this size. Longer prompts go to the pool.
INLINE_PREPARE_MAX_CHARS = 4096


class EngineWarmingUpError(RuntimeError):
    """A request arrived before the warm-up finished; the server answers 503."""


class AsyncEngine:
    """Serves many concurrent requests from one background step loop.

    Not a doctest (it needs a running event loop and loads SmolLM2); inside a coroutine::

        aengine = AsyncEngine(LLMEngine(EngineConfig(device="cpu")))
        messages = [{"role": "user", "content": "Hi"}]
        async for delta in aengine.generate("r1", messages=messages,
                                            sampling=SamplingParams(temperature=0, max_tokens=8)):
            print(delta, end="")         # Hello! How can I assist you today
        aengine.stop()                   # joins the step thread
    """

    def __init__(self, engine: LLMEngine, *, warm_up: bool = False,
                 max_pending_outputs: int = MAX_PENDING_OUTPUTS) -> None:
        if max_pending_outputs < 1:
            raise ValueError(f"max_pending_outputs must be >= 1, got {max_pending_outputs}")
        self.engine = engine
        self.max_pending_outputs = max_pending_outputs
        self.num_slow_readers = 0  # requests aborted because their reader fell behind
        # True until the step thread has run the warm-up (failed or not). One bool, written
        # by the step thread only: reads need no lock.
        self._warm_up_pending = warm_up
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._prepare_pool: ThreadPoolExecutor | None = None
        self.step_errors = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._prepare_pool = ThreadPoolExecutor(NUM_PREPARE_THREADS,
                                                thread_name_prefix="engine-tokenize")
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._prepare_pool is not None:
            self._prepare_pool.shutdown(wait=False, cancel_futures=True)
            self._prepare_pool = None

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def warming_up(self) -> bool:
        """The warm-up asked for in the constructor has not finished yet."""
        return self._warm_up_pending

    # -- requests --------------------------------------------------------------------------

    async def submit(self, request_id: str, *, sampling: SamplingParams,
                     messages: list[dict] | None = None, prompt: str | None = None,
                     prompt_token_ids: list[int] | None = None,
                     fill_max_tokens: bool = False) -> RequestStream:
        """Template, tokenize and admit now (errors raise here, before any output); then
        iterate the returned stream for outputs. `fill_max_tokens` replaces
        `sampling.max_tokens` with whatever context the prompt leaves (OpenAI's default)."""
        if self._thread is None:
            self.start()
        if self._warm_up_pending:
            raise EngineWarmingUpError("the engine is warming up")
        if prompt_token_ids is None:
            if messages is None and prompt is None:
                raise ValueError("one of messages, prompt or prompt_token_ids is required")
            if _num_chars(messages, prompt) <= INLINE_PREPARE_MAX_CHARS:
                prompt_token_ids = self._prepare(request_id, messages, prompt)
            else:
                prompt_token_ids = await asyncio.get_running_loop().run_in_executor(
                    self._prepare_pool,
                    functools.partial(self._prepare, request_id, messages, prompt))
        if fill_max_tokens:
            room = self.engine.max_model_len - len(prompt_token_ids)
            sampling = dataclasses.replace(sampling, max_tokens=max(1, room))
        grammar = None
        if sampling.json_schema is not None:
            # Compiled on a pool thread, not under the lock the step thread needs (~1 ms;
            # the first one also builds the vocabulary's token trie, ~0.3 s).
            grammar = await asyncio.get_running_loop().run_in_executor(
                self._prepare_pool, self.engine.grammars.compile, sampling.json_schema)
        stream = RequestStream(self, request_id, len(prompt_token_ids),
                               self.max_pending_outputs)
        with self._lock:
            seq = self.engine.add_request(request_id, prompt_token_ids, sampling, grammar)
            stream.num_cached_tokens = seq.num_cached_tokens
            self._streams[request_id] = stream
        self._wake.set()
        return stream

    def _prepare(self, request_id: str, messages: list[dict] | None,
                 prompt: str | None) -> list[int]:
        """Template and tokenize, on a pool thread; the recorder marks both stage ends."""
        if messages is not None:
            chat = self.engine.render_chat(messages, request_id)
            return self.engine.tokenize(chat, request_id, add_bos=False, param="messages")
        # Completions have no template: the stage is real but takes no time.
        self.engine.recorder.template_done(request_id, self.engine.clock_ns())
        return self.engine.tokenize(prompt, request_id, param="prompt")

    async def generate(self, request_id: str, *, sampling: SamplingParams,
                       messages: list[dict] | None = None,
                       prompt: str | None = None) -> AsyncIterator[str]:
        """Yield text deltas as they become printable."""
        stream = await self.submit(request_id, sampling=sampling, messages=messages, prompt=prompt)
        async for out in stream:
            if out.text:
                yield out.text

    def abort(self, request_id: str) -> bool:
        """Abort now: the request's KV blocks are free when this returns."""
        with self._lock:
            self._streams.pop(request_id, None)
            return self.engine.abort(request_id)

    def abort_slow_reader(self, request_id: str) -> None:
        """Abort a request whose reader fell `max_pending_outputs` behind."""
        self.num_slow_readers += 1
        log.warning("request %s aborted: its reader fell %d outputs behind", request_id,
                    self.max_pending_outputs)
        self.abort(request_id)

    def stats(self) -> tuple[int, int, float]:
        """(running, waiting, kv usage ratio), read consistently."""
        with self._lock:
            return self.engine.num_running, self.engine.num_waiting, self.engine.kv_usage_ratio

    # -- the step thread -------------------------------------------------------------------

    def _run(self) -> None:
        if self._warm_up_pending:
            self._warm_up()
        while not self._stopping:
            with self._lock:
                plan = self.engine.schedule() if self.engine.has_unfinished() else None
                if plan is None:
                    self._wake.clear()
            if plan is None:
                self._wake.wait()
                continue
            if not plan.scheduled:
                # Nothing fits right now (all waiting, blocks pinned); an abort or a finish
                # will wake us. The timeout only bounds a missed wake-up.
                self._wake.wait(timeout=0.05)
                self._wake.clear()
                continue
            try:
                logits, start_ns, end_ns = self.engine.execute(plan)
            except Exception:  # noqa: BLE001 - find the sequence that breaks the batch
                self.step_errors += 1
                outputs = self._run_one_by_one(plan)
            else:
                try:
                    with self._lock:
                        outputs = self.engine.postprocess(plan, logits, start_ns, end_ns)
                except Exception as exc:  # noqa: BLE001 - a bug outside per-sequence work
                    self.step_errors += 1
                    outputs = self._fail_plan(plan, exc)
            self._deliver(self._dispatch, outputs)

    def _warm_up(self) -> None:
        # No lock: `submit` admits nothing while the warm-up is pending, and holding the
        # lock would block /metrics (`stats`) for as long as a first compile takes.
        try:
            seconds = self.engine.warm_up()
            log.info("engine warm-up took %.3f s; %s", seconds,
                     self.engine.decode_graphs.describe())
        except Exception:  # noqa: BLE001 - serve anyway: a request will then pay the cold start
            log.exception("engine warm-up failed; serving without it")
        finally:
            self._warm_up_pending = False

    def _deliver(self, callback, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop is closed: nobody is left to read outputs
            self._stopping = True

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            if out.finish_reason == "error":
                stream._put(EngineRequestError(out.error or "the engine failed on this request"))
            else:
                stream._put(out)

    def _run_one_by_one(self, plan: SchedulerOutput) -> list[RequestOutput]:
        """Rerun a failed forward pass one sequence at a time: the plan's token counts and
        positions are unchanged (nothing was committed), so each rerun is the same work."""
        outputs: list[RequestOutput] = []
        for item in plan.scheduled:
            alone = SchedulerOutput((item,), (), (), item.num_new_tokens)
            try:
                if item.seq.is_finished:  # aborted meanwhile
                    continue
                logits, start_ns, end_ns = self.engine.execute(alone)
                with self._lock:
                    outputs += self.engine.postprocess(alone, logits, start_ns, end_ns)
            except Exception as exc:  # noqa: BLE001 - this sequence breaks the pass
                outputs += self._fail_plan(alone, exc)
        return outputs

    def _fail_plan(self, plan: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        # An output per sequence, even one that finished before the failure: `_dispatch`
        # drops the outputs of streams that already ended.
        with self._lock:
            return [self.engine.fail(item.seq.request_id, exc, item.seq)
                    for item in plan.scheduled]


# What a template adds around each message (role markers, newlines), in characters: counted
# so that many empty messages are not mistaken for a short prompt.
_TEMPLATE_CHARS_PER_MESSAGE = 32


def _num_chars(messages: list[dict] | None, prompt: str | None) -> int:
    """About how many characters the prepared prompt has.

    >>> _num_chars([{"role": "user", "content": "Hi"}, {"role": "user"}], None)
    66
    """
    if messages is None:
        return len(prompt or "")
    return (len(messages) * _TEMPLATE_CHARS_PER_MESSAGE
            + sum(len(c) for m in messages if isinstance(c := m.get("content"), str)))
