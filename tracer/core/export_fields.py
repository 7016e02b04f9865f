"""Fills what the trace export reads of a record, on the tracer's worker thread.

A deferred sink placed before the diagnosis (which drops `prompt_source`) and before the
log line (which writes these fields): it sets `record.arrival_unix_ms` from the process's
one `Clock`, and `record.block_chain` from the engine's report of the prompt's blocks or,
behind the proxy, from the prompt text (tracer/record/block_chain.py). Hashing here, not on
the request's thread, costs the request nothing; the worker pays 1-2 µs a 16-token block
(a 2,000-token prompt: 0.15-0.3 ms on a busy 2-core machine).
"""
from __future__ import annotations

from tracer.record import block_chain
from tracer.record.clock import Clock
from tracer.record.prompt_overlap import prompt_parts
from tracer.record.request_record import RequestRecord


class EngineBlocks:
    """What our engine reports of a prompt (instrumented_engine/engine/recorder.py,
    `prompt_blocks`): its prefix cache's chained block hashes, or without prefix caching
    the prompt's token ids (by reference; the sequence is finished, so they no longer
    change)."""

    __slots__ = ("hashes", "token_ids", "block_size")

    def __init__(self, hashes, token_ids, block_size: int) -> None:
        self.hashes, self.token_ids, self.block_size = hashes, token_ids, block_size


class ExportFields:
    """Sets `arrival_unix_ms` and `block_chain`; see the module docstring.

    >>> record = RequestRecord("r", "1" * 32, "2" * 16, "m", "chat", 5_000_000, 9_000_000,
    ...                        source="proxy", prompt_source="x" * 200)
    >>> ExportFields(Clock(wall_ns=10**18, perf_ns=0)).publish(record)
    >>> record.arrival_unix_ms, len(record.block_chain) // 8
    (1000000000005, 3)
    """

    name = "export_fields"   # in the tracer's sink failure counts

    def __init__(self, clock: Clock,
                 chars_per_block: int = block_chain.DEFAULT_CHARS_PER_BLOCK) -> None:
        self.clock = clock
        self.chars_per_block = chars_per_block

    def publish(self, record: RequestRecord) -> None:
        try:
            record.arrival_unix_ms = self.clock.to_epoch_ns(record.start_ns) // 1_000_000
            record.block_chain = self._chain(record)
        finally:
            record.block_source = None      # the token ids are never kept past this point

    def _chain(self, record: RequestRecord) -> bytes:
        blocks = record.block_source
        if isinstance(blocks, EngineBlocks):
            if blocks.hashes and blocks.block_size == block_chain.TOKENS_PER_BLOCK:
                return block_chain.from_engine_hashes(blocks.hashes)
            # No prefix caching, or blocks of another size: chain the tokens in 16s.
            return block_chain.from_tokens(blocks.token_ids[:record.num_prompt_tokens])
        if record.source == "proxy" and record.prompt_source is not None:
            # The JSON body is parsed once, here (~1 µs a kB): the diagnosis after this sink
            # gets its parts (a list of strings is its own parts, the same text).
            parts = prompt_parts(record.prompt_source)
            record.prompt_source = parts
            return block_chain.from_text("\n".join(parts), self.chars_per_block)
        return b""
