"""BlockManager: allocation order, chained prefix hashes, sharing, lazy LRU eviction."""
from __future__ import annotations

import pytest

from instrumented_engine.engine.block_manager import BlockManager, chain_hash
from instrumented_engine.engine.sampling import SamplingParams
from instrumented_engine.engine.sequence import Sequence

BS = 4


def make_seq(token_ids: list[int], name: str = "r") -> Sequence:
    return Sequence(name, token_ids, SamplingParams(max_tokens=8), block_size=BS)


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    """What a step does: allocate the uncomputed tokens, compute them, commit."""
    assert bm.allocate_slots(seq, seq.num_uncomputed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)


def cached_run(bm: BlockManager, token_ids: list[int], name: str = "done") -> list[int]:
    """A request that runs to completion and frees: its full blocks stay cached."""
    seq = make_seq(token_ids, name)
    bm.lookup(seq)
    compute_all(bm, seq)
    table = list(seq.block_table)
    bm.free(seq)
    return table


def test_miss_allocates_fresh_blocks_in_order():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(10)))
    assert bm.lookup(a) == 0 and a.looked_up and a.num_computed_tokens == 0
    assert bm.allocate_slots(a, 6)
    assert a.block_table == [0, 1]
    assert bm.allocate_slots(a, 10)  # grows to cover 10 tokens; no new blocks beyond that
    assert a.block_table == [0, 1, 2]
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 5)
    assert bm.usage_ratio == pytest.approx(3 / 8)


def test_hit_reuses_the_same_block_ids():
    bm = BlockManager(num_blocks=8, block_size=BS)
    assert cached_run(bm, list(range(10))) == [0, 1, 2]
    # Freed tail-first onto the free list's tail: 3..7 are older, then 2, 1, 0.
    assert bm.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    b = make_seq(list(range(8)) + [50, 51, 52])
    assert bm.lookup(b) == 8
    assert b.block_table == [0, 1] and b.num_computed_tokens == 8
    assert bm.block(0).ref_count == 1 and not bm.block(0).is_free
    assert bm.allocate_slots(b, 3)
    assert b.block_table == [0, 1, 3]  # the new block comes from the free list's head


def test_chain_hash_covers_the_whole_prefix():
    bm = BlockManager(num_blocks=8, block_size=BS)
    shared = [7, 7, 7, 7]
    a_table = cached_run(bm, [1, 2, 3, 4] + shared + [0])
    c = make_seq([9, 9, 9, 9] + shared + [0], "c")
    assert bm.lookup(c) == 0  # the same second block after a different first one: a miss
    compute_all(bm, c)
    a1, c1 = bm.block(a_table[1]), bm.block(c.block_table[1])
    assert a1.token_ids == c1.token_ids == tuple(shared)
    assert a1.hash != c1.hash
    assert a1.hash == chain_hash(chain_hash(None, (1, 2, 3, 4)), tuple(shared))
    assert bm.num_cached_blocks == 4


def test_forced_hash_collision_is_a_miss_not_corruption():
    bm = BlockManager(num_blocks=8, block_size=BS, hash_fn=lambda prev, tokens: 42)
    a_table = cached_run(bm, [1, 2, 3, 4, 5])
    b = make_seq([5, 6, 7, 8, 9], "b")
    assert bm.lookup(b) == 0 and b.block_table == []
    compute_all(bm, b)
    assert a_table[0] not in b.block_table
    bm.free(b)
    # The first cached entry is kept; A's prefix still hits its own block.
    a2 = make_seq([1, 2, 3, 4, 6], "a2")
    assert bm.lookup(a2) == 4 and a2.block_table == [a_table[0]]


def test_collision_with_a_block_of_another_chain_checks_the_parent_hash():
    # A hash that sends (4,4,4,4) to 2 wherever it sits: only the stored parent hash
    # tells a first block from a second block with the same tokens.
    bm = BlockManager(num_blocks=8, block_size=BS,
                      hash_fn=lambda prev, tokens: 1 if tokens == (3, 3, 3, 3) else 2)
    cached_run(bm, [3, 3, 3, 3, 4, 4, 4, 4, 0])  # block 1: hash 2, parent hash 1
    c = make_seq([3, 3, 3, 3, 4, 4, 4, 4, 0], "c")
    assert bm.lookup(c) == 8  # the genuine chain hits
    bm.free(c)
    d = make_seq([4, 4, 4, 4, 4, 4, 4, 4, 0], "d")
    assert bm.lookup(d) == 0 and d.block_table == []


def test_two_sharers_count_references():
    bm = BlockManager(num_blocks=8, block_size=BS)
    table = cached_run(bm, list(range(9)))
    a, b = make_seq(list(range(9)), "a"), make_seq(list(range(8)) + [99], "b")
    assert bm.lookup(a) == 8 and bm.lookup(b) == 8
    assert a.block_table == b.block_table == table[:2]
    assert [bm.block(i).ref_count for i in table[:2]] == [2, 2]
    bm.free(a)
    assert [bm.block(i).ref_count for i in table[:2]] == [1, 1]
    assert not any(bm.block(i).is_free for i in table[:2])
    bm.free(b)
    assert all(bm.block(i).is_free and bm.block(i).ref_count == 0 for i in table[:2])
    assert a.block_table == [] and b.block_table == []
    assert bm.num_used_blocks == 0


def test_eviction_is_lru_and_tail_first():
    bm = BlockManager(num_blocks=6, block_size=BS)
    old = cached_run(bm, list(range(12)) + [0], "old")  # blocks 0..3, three full
    assert old == [0, 1, 2, 3]
    assert bm.free_block_ids() == [4, 5, 3, 2, 1, 0]
    filler = make_seq([100] * 13, "filler")
    bm.lookup(filler)
    assert bm.allocate_slots(filler, 13)
    # Never-used blocks first, then the old sequence's tail (3 partial, 2 its last full).
    assert filler.block_table == [4, 5, 3, 2]
    assert bm.block(2).hash is None  # reused: hash dropped at allocation, not before
    assert bm.num_cached_blocks == 2
    again = make_seq(list(range(12)) + [1], "again")
    assert bm.lookup(again) == 8  # blocks 0, 1 survive; block 2 was evicted
    assert again.block_table == [0, 1]


def test_lazy_eviction_revives_a_freed_block():
    bm = BlockManager(num_blocks=4, block_size=BS)
    table = cached_run(bm, list(range(9)))
    assert bm.num_used_blocks == 0 and bm.block(table[0]).hash is not None
    again = make_seq(list(range(9)), "again")
    assert bm.lookup(again) == 8
    assert [bm.block(i).ref_count for i in table[:2]] == [1, 1]
    assert bm.num_free_blocks == 2 and table[0] not in bm.free_block_ids()


def test_allocation_is_all_or_nothing():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = make_seq(list(range(8)), "a")
    assert bm.allocate_slots(a, 8) and a.block_table == [0, 1]
    b = make_seq(list(range(100, 112)), "b")
    assert not bm.allocate_slots(b, 12)  # needs 3, only 2 free
    assert b.block_table == [] and bm.num_free_blocks == 2
    assert bm.allocate_slots(b, 8) and b.block_table == [2, 3]
    assert not bm.allocate_slots(b, 9)
    assert b.block_table == [2, 3] and bm.num_free_blocks == 0


@pytest.mark.parametrize(("num_tokens", "expected_hit"), [(8, 4), (9, 8), (12, 8), (13, 12)])
def test_lookup_leaves_the_last_token_to_compute(num_tokens, expected_hit):
    bm = BlockManager(num_blocks=8, block_size=BS)
    cached_run(bm, list(range(13)))
    seq = make_seq(list(range(num_tokens)), "s")
    assert bm.lookup(seq) == expected_hit
    assert seq.num_uncomputed_tokens >= 1
    assert len(seq.block_table) == expected_hit // BS


def test_commit_hashes_only_full_computed_blocks_and_keeps_the_first_copy():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a, b = make_seq(list(range(10)), "a"), make_seq(list(range(10)), "b")
    for seq in (a, b):  # both miss: computed concurrently, before either commits
        bm.lookup(seq)
        assert bm.allocate_slots(seq, 10)
    a.num_computed_tokens = 6
    bm.commit(a)
    assert bm.block(a.block_table[0]).hash is not None
    assert bm.block(a.block_table[1]).hash is None  # half computed
    a.num_computed_tokens = b.num_computed_tokens = 10
    bm.commit(a)
    bm.commit(b)
    a_table, b_table = list(a.block_table), list(b.block_table)
    assert bm.block(a_table[2]).hash is None  # partial block
    assert bm.block(b_table[0]).hash == bm.block(a_table[0]).hash
    assert bm.num_cached_blocks == 2
    bm.free(a)
    bm.free(b)
    c = make_seq(list(range(10)), "c")
    assert bm.lookup(c) == 8
    assert c.block_table == a_table[:2]  # the first cached copy wins


def test_prefix_caching_disabled_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    cached_run(bm, list(range(9)))
    again = make_seq(list(range(9)), "again")
    assert bm.lookup(again) == 0 and again.looked_up and again.block_table == []
    assert bm.num_cached_blocks == 0


def test_everything_freed_leaves_no_used_blocks():
    bm = BlockManager(num_blocks=16, block_size=BS)
    cached_run(bm, list(range(20)))
    seqs = [make_seq(list(range(n)), f"s{n}") for n in (5, 9, 17, 20)]
    for seq in seqs:
        bm.lookup(seq)
        assert bm.allocate_slots(seq, seq.num_uncomputed_tokens)
    assert bm.num_used_blocks > 0
    for seq in seqs:
        bm.free(seq)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 16
    assert all(bm.block(i).ref_count == 0 for i in range(16))
