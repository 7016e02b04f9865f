"""Paged KV cache bookkeeping with prefix caching (nano-vllm / vLLM v1 style).

The cache is `num_blocks` blocks of `block_size` token slots. A sequence's `block_table`
lists the blocks that hold its KV, in token order. Full, computed blocks are hashed in a
chain (each hash covers every earlier token), so a new request whose prompt starts with the
same tokens reuses those blocks instead of recomputing them.

Freed blocks keep their hash (lazy eviction): until the allocator actually reuses one, a
later lookup can still hit it and revive it. The free list is ordered least recently freed
first, and a sequence frees its blocks tail-first, so a prefix outlives its continuations.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from instrumented_engine.engine.sequence import Sequence

HashFn = Callable[[int | None, tuple[int, ...]], int]


def chain_hash(prev_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of one full block given the hash of the block before it (None for the first).

    Python's hash of a tuple of ints is not randomised per process, so it is stable.
    """
    return hash((prev_hash, token_ids))


class _Block:
    __slots__ = ("block_id", "ref_count", "hash", "prev_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        # Set once the block is full and computed; kept while the block sits in the free list.
        self.hash: int | None = None
        self.prev_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()

    def forget(self) -> None:
        self.hash = None
        self.prev_hash = None
        self.token_ids = ()


@dataclass(slots=True, frozen=True)
class BlockInfo:
    """A read-only snapshot of one block, for tests and debugging."""

    block_id: int
    ref_count: int
    hash: int | None
    token_ids: tuple[int, ...]
    is_free: bool


class BlockManager:
    """Allocates KV blocks to sequences and shares full blocks between equal prefixes.

    >>> from instrumented_engine.engine.sampling import SamplingParams
    >>> bm = BlockManager(num_blocks=8, block_size=4)
    >>> a = Sequence("a", list(range(10)), SamplingParams(), block_size=4)
    >>> bm.lookup(a), bm.allocate_slots(a, 10), a.block_table
    (0, True, [0, 1, 2])
    >>> a.num_computed_tokens = 10; bm.commit(a); bm.free(a)
    >>> b = Sequence("b", list(range(9)) + [99], SamplingParams(), block_size=4)
    >>> bm.lookup(b), b.block_table
    (8, [0, 1])
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: HashFn = chain_hash) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, "
                             f"got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._hash_fn = hash_fn
        self._blocks = [_Block(i) for i in range(num_blocks)]
        # Keys are block ids; order is eviction order (head = evicted first). O(1) everything.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id

    # -- prefix lookup (the kv_lookup stage) ----------------------------------------------

    def lookup(self, seq: Sequence) -> int:
        """Reserve the cached blocks that hold a prefix of `seq`; return the hit tokens.

        At least one token is always left to compute: the engine needs the last token's
        logits, so the block containing it is never taken from the cache.
        """
        if seq.block_table:
            raise ValueError(f"{seq!r} already holds blocks; free it before a new lookup")
        seq.looked_up = True
        seq.num_computed_tokens = 0
        if not self.enable_prefix_caching:
            return 0
        prev_hash: int | None = None
        for index in range((seq.num_tokens - 1) // self.block_size):
            token_ids = tuple(seq.block_tokens(index))
            block_hash = self._hash_fn(prev_hash, token_ids)
            block = self._find_cached(block_hash, prev_hash, token_ids)
            if block is None:
                break
            self._take(block)
            seq.block_table.append(block.block_id)
            prev_hash = block_hash
        seq.num_computed_tokens = len(seq.block_table) * self.block_size
        return seq.num_computed_tokens

    def _find_cached(self, block_hash: int, prev_hash: int | None,
                     token_ids: tuple[int, ...]) -> _Block | None:
        block_id = self._cached.get(block_hash)
        if block_id is None:
            return None
        block = self._blocks[block_id]
        # A hash collision must cost a miss, never someone else's KV.
        if block.token_ids != token_ids or block.prev_hash != prev_hash:
            return None
        return block

    def _take(self, block: _Block) -> None:
        if block.ref_count == 0:
            del self._free[block.block_id]
        block.ref_count += 1

    # -- allocation -----------------------------------------------------------------------

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow `seq.block_table` to hold `num_computed_tokens + num_new_tokens` tokens.

        All or nothing: returns False, changing nothing, when too few blocks are free.
        """
        num_needed = (seq.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
                      - len(seq.block_table))
        if num_needed > len(self._free):
            return False
        for _ in range(num_needed):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            # Lazy eviction happens here, and only here: the old content is overwritten now.
            if block.hash is not None and self._cached.get(block.hash) == block_id:
                del self._cached[block.hash]
            block.forget()
            block.ref_count = 1
            seq.block_table.append(block_id)
        return True

    def commit(self, seq: Sequence) -> None:
        """Register the hashes of `seq`'s blocks that became full and computed."""
        if not self.enable_prefix_caching:
            return
        table = seq.block_table
        num_full = min(seq.num_computed_tokens // self.block_size, len(table))
        # Hashed blocks form a prefix of the table; walk back to its end (O(new blocks)).
        start = num_full
        while start > 0 and self._blocks[table[start - 1]].hash is None:
            start -= 1
        for index in range(start, num_full):
            block = self._blocks[table[index]]
            prev_hash = self._blocks[table[index - 1]].hash if index else None
            token_ids = tuple(seq.block_tokens(index))
            block.hash = self._hash_fn(prev_hash, token_ids)
            block.prev_hash = prev_hash
            block.token_ids = token_ids
            # An identical block computed by a concurrent sequence is already cached: keep
            # that one; this copy still knows its hash so the chain continues past it.
            self._cached.setdefault(block.hash, block.block_id)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; unreferenced blocks join the free list, hash kept."""
        for block_id in reversed(seq.block_table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table = []

    def prompt_hashes(self, seq: Sequence) -> list[int]:
        """The cached hashes of `seq`'s full prompt blocks, in order, up to the first block
        not hashed yet (empty without prefix caching): read, not computed."""
        out = []
        for block_id in seq.block_table[:seq.num_prompt_tokens // self.block_size]:
            block_hash = self._blocks[block_id].hash
            if block_hash is None:
                break
            out.append(block_hash)
        return out

    # -- state ----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref_count > 0 (exactly those not in the free list)."""
        return len(self._blocks) - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks a lookup could hit, referenced or not."""
        return len(self._cached)

    @property
    def usage_ratio(self) -> float:
        return self.num_used_blocks / len(self._blocks)

    def block(self, block_id: int) -> BlockInfo:
        b = self._blocks[block_id]
        return BlockInfo(b.block_id, b.ref_count, b.hash, b.token_ids, block_id in self._free)

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (the next allocation takes the first)."""
        return list(self._free)
