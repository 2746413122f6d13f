"""docs/contract.md §6: the ref-counted pool and its invariant check."""

import pytest

from blocktable.reference import BlockPool, InvariantError


def test_free_queue_starts_in_id_order_without_the_null_block():
    assert BlockPool(5).free_queue() == [1, 2, 3, 4]
    assert BlockPool(5, null_block=False).free_queue() == [0, 1, 2, 3, 4]


def test_allocate_pops_from_the_head_and_free_appends_last_block_first():
    pool = BlockPool(6)
    a = pool.allocate(3)
    assert a == [1, 2, 3] and pool.free_queue() == [4, 5]
    assert [pool.ref[b] for b in a] == [1, 1, 1]
    pool.free(list(reversed(a)))  # the caller passes last block first
    assert pool.free_queue() == [4, 5, 3, 2, 1]
    assert pool.allocate(4) == [4, 5, 3, 2]
    pool.check_invariants([[4, 5, 3, 2]])


def test_a_block_still_shared_is_not_queued():
    pool = BlockPool(4)
    ids = pool.allocate(2)
    pool.share(ids)
    pool.free(ids[::-1])
    assert pool.free_queue() == [3] and pool.ref[1:].tolist() == [1, 1, 0]
    pool.free(ids[::-1])
    assert pool.free_queue() == [3, 2, 1]


def test_bad_pool_calls_are_rejected_and_change_nothing(rejects):
    pool = BlockPool(5)
    held = pool.allocate(2)  # [1, 2]
    rejects(pool, ValueError, "cannot allocate 3 blocks: only 2 are free", pool.allocate, 3)
    rejects(pool, ValueError, "free: block 2 is listed twice in one call", pool.free, [2, 1, 2])
    rejects(pool, ValueError, "free: double free of block 3 \\(its ref is already 0\\)", pool.free, [1, 3])
    rejects(pool, ValueError, "free: block 0 is the null block", pool.free, [0])
    rejects(pool, ValueError, "free: block 7 is out of range \\[0, 5\\)", pool.free, [7])
    rejects(pool, TypeError, "free: block id must be an int, got float", pool.free, [1.0])
    rejects(pool, ValueError, "share: block 4 is free \\(ref 0\\)", pool.share, [1, 4])
    rejects(pool, ValueError, "allocate needs a count >= 0, got -1", pool.allocate, -1)
    pool.check_invariants([held])


def test_bug_42571_a_duplicate_id_is_never_queued_twice(rejects):
    """vLLM queued an id listed twice in one free call twice; here the call is refused."""
    pool = BlockPool(4)
    pool.allocate(1)
    rejects(pool, ValueError, "listed twice", pool.free, [1, 1])
    assert pool.free_queue().count(1) == 0


def test_null_block_is_never_handed_out():
    pool = BlockPool(3)
    assert pool.allocate(2) == [1, 2]
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.allocate(1)


def design_notes_pool(ref_of_block_5: int) -> tuple[BlockPool, list[list[int]]]:
    """docs/contract.md §6's picture, null_block=False: seq 1 -> 0, 1, 5; seq 2 -> 2, 1;
    seq 3 -> 4, 5, 7. Built directly: this sharing is not a prefix, fork cannot make it."""
    pool = BlockPool(8, null_block=False)
    tables = [[0, 1, 5], [2, 1], [4, 5, 7]]
    pool.ref = [1, 2, 1, 0, 1, ref_of_block_5, 0, 1]
    pool.queue = [3, 6]
    return pool, tables


def test_design_notes_picture_labels_block_5_wrongly():
    pool, tables = design_notes_pool(ref_of_block_5=1)  # as the picture labels it
    with pytest.raises(InvariantError, match="block 5 has ref 1 but 2 live tables hold it") as info:
        pool.check_invariants(tables)
    assert info.value.block == 5 and info.value.invariant == "ref-equals-holders"


def test_design_notes_picture_with_block_5_at_ref_2_holds():
    pool, tables = design_notes_pool(ref_of_block_5=2)
    pool.check_invariants(tables)
    # Freeing sequence 2 (blocks 2, 1; last first) leaves block 1 at ref 1, in use.
    pool.free([1, 2])
    assert pool.ref[1] == 1 and 1 not in pool.free_queue() and pool.free_queue() == [3, 6, 2]
    pool.check_invariants([tables[0], tables[2]])


@pytest.mark.parametrize("corrupt, invariant, block, match", [
    (lambda p: p.queue.append(3), "queued-once", 3, "block 3 is in the free queue 2 times"),
    (lambda p: p.queue.remove(3), "queued-iff-free", 3, "block 3 has ref 0 but is not in the free queue"),
    (lambda p: p.queue.append(2), "queued-iff-free", 2, "block 2 has ref 1 but is in the free queue"),
    (lambda p: p.ref.__setitem__(2, 3), "ref-equals-holders", 2, "block 2 has ref 3 but 1 live tables hold it"),
    (lambda p: p.queue.insert(0, 0), "null-block", 0, "block 0 is the null block"),
    (lambda p: p.queue.append(9), "id-range", 9, "block 9, outside the pool"),
])
def test_each_invariant_is_checked_and_named(corrupt, invariant, block, match):
    pool = BlockPool(5)
    pool.allocate(2)  # 1, 2 in use, held by one table
    pool.check_invariants([[1, 2]])
    corrupt(pool)
    with pytest.raises(InvariantError, match=match) as info:
        pool.check_invariants([[1, 2]])
    assert info.value.invariant == invariant and info.value.block == block


def test_conservation_holds_whenever_the_check_passes():
    """free + in use = non-null blocks follows from the per-block invariants; walk a
    pool through allocations, shares and frees and check both after every call."""
    pool = BlockPool(10)
    tables = [pool.allocate(3), pool.allocate(2)]
    pool.share(tables[0])
    tables.append(list(tables[0]))
    for step in [lambda: pool.free(tables.pop(0)[::-1]), lambda: tables.append(pool.allocate(4)),
                 lambda: pool.free(tables.pop()[::-1]), lambda: pool.free(tables.pop()[::-1])]:
        step()
        pool.check_invariants(tables)
        in_use = sum(1 for b in range(1, 10) if pool.ref[b] > 0)
        assert pool.num_free + in_use == pool.num_usable == 9


def test_holders_count_tables_not_entries():
    """docs/contract.md §6: a block's ref is the number of live tables holding it; a table that
    lists a block twice holds it once, and each of two tables holds it."""
    pool = BlockPool(5)
    pool.allocate(2)  # 1, 2 at ref 1
    pool.check_invariants([[1, 2, 2]])
    with pytest.raises(InvariantError, match="block 2 has ref 1 but 2 live tables hold it"):
        pool.check_invariants([[1, 2], [2]])


@pytest.mark.parametrize("bad", [-1, 5])
def test_a_table_entry_outside_the_pool_is_named(bad):
    pool = BlockPool(5)
    pool.allocate(2)
    with pytest.raises(InvariantError, match=f"a live table holds block {bad}, outside the pool") as info:
        pool.check_invariants([[1, 2], [], [bad]])
    assert info.value.invariant == "id-range" and info.value.block == bad


# -- docs/contract.md §8: the cache map on the pool ----------------------------------------------

KEY_A = (0, (1, 2, 3, 4))  # a key as the reference spells it: (group, whole token prefix)
KEY_B = (0, (1, 2, 3, 4, 5, 6, 7, 8))


def caching_pool():
    """Blocks 1..5; 1 and 2 in use and cached under KEY_A and KEY_B."""
    pool = BlockPool(6, prefix_caching=True)
    pool.allocate(2)
    pool.cache_block(KEY_A, 1)
    pool.cache_block(KEY_B, 2)
    return pool


def test_cached_blocks_are_found_by_key_and_by_block():
    pool = caching_pool()
    assert pool.first_cached(KEY_A) == 1 and pool.first_cached((1, KEY_A[1])) is None  # the group is in the key
    assert pool.block_key(2) == KEY_B and pool.block_key(3) is None
    assert pool.is_cached(1) and not pool.is_cached(3)
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]


def test_touch_takes_a_free_block_from_the_middle_and_raises_every_ref():
    pool = caching_pool()
    pool.free([2, 1])  # queue: 3, 4, 5, 2, 1
    pool.allocate(1)  # 3
    pool.share([3])
    pool.cache_block((0, (9, 9, 9, 9)), 3)  # 3 in use (ref 2) and cached
    pool.touch([2, 3])  # 2 leaves the queue from between 5 and 1; 3 only gains a ref
    assert pool.free_queue() == [4, 5, 1]
    assert pool.ref[1:4].tolist() == [0, 1, 3]
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2]), (0, 4, [3])]


def test_allocate_evicts_a_cached_block_before_handing_it_out():
    pool = caching_pool()
    pool.allocate(3)  # 3, 4, 5: nothing cached
    pool.free([2, 1])  # queue: 2, 1
    assert pool.allocate(1) == [2]
    assert pool.cache_listing() == [(0, 4, [1])] and pool.block_key(2) is None
    assert pool.ref[2] == 1


def test_reset_prefix_cache_needs_every_block_free():
    pool = caching_pool()
    assert pool.reset_prefix_cache() is False and len(pool.cached) == 2
    pool.free([2, 1])
    assert pool.reset_prefix_cache() is True and pool.cached == {}
    assert pool.free_queue() == [3, 4, 5, 2, 1]


# -- docs/contract.md §6's free order option ---------------------------------------------------


def test_the_vllm_free_order_puts_uncached_blocks_at_the_head_in_the_order_given():
    for prefix_caching in (False, True):
        pool = BlockPool(6, free_order="vllm", prefix_caching=prefix_caching)
        assert pool.allocate(3) == [1, 2, 3]
        pool.free([3, 2, 1])
        assert pool.free_queue() == [3, 2, 1, 4, 5]
        assert pool.allocate(2) == [3, 2]  # the blocks just freed are reused first


def test_the_tail_free_order_is_the_default():
    pool = BlockPool(6)
    pool.allocate(3)
    pool.free([3, 2, 1])
    assert pool.free_queue() == [4, 5, 3, 2, 1]


def test_the_vllm_free_order_keeps_cached_blocks_at_the_tail():
    """Blocks 1 and 2 full and cached, 3 partial: freeing [3, 2, 1] puts 3 at the head
    and 2, 1 at the tail, where they stay hittable longest (LRU)."""
    pool = BlockPool(7, prefix_caching=True, free_order="vllm")
    assert pool.allocate(3) == [1, 2, 3]
    pool.cache_block(KEY_A, 1)
    pool.cache_block(KEY_B, 2)
    pool.free([3, 2, 1])
    assert pool.free_queue() == [3, 4, 5, 6, 2, 1]
    pool.check_invariants([])


def test_a_block_still_held_stays_out_of_the_queue_in_either_order():
    pool = BlockPool(5, free_order="vllm")
    a = pool.allocate(2)
    pool.share(a)
    pool.free(a[::-1])
    assert pool.free_queue() == [3, 4]
    pool.free(a[::-1])
    assert pool.free_queue() == [2, 1, 3, 4]


def test_an_unknown_free_order_is_refused():
    with pytest.raises(ValueError, match="free_order must be one of tail, vllm"):
        BlockPool(5, free_order="lifo")
