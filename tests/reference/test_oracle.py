"""docs/contract.md §7: the paged-cache model: write through a slot mapping, copy blocks, gather."""

import numpy as np

from blocktable.reference import slot_mapping
from blocktable.reference.oracle import POISON, PagedCache


def test_write_skips_negative_slots_and_gather_reads_back():
    cache = PagedCache(8 * 4)  # 8 blocks of K=B=4
    cache.write(np.array([5, -1, 6, 0, -1], np.int64), np.array([50, 99, 60, 70, 98], np.int64))
    expected = np.full(32, POISON, np.int64)
    expected[[5, 6, 0]] = [50, 60, 70]
    assert np.array_equal(cache.data, expected)
    row = np.array([1, 0, 7], np.int32)  # positions 0..3 -> block 1 (slots 4..7)
    got = cache.gather(row, 3, kv_block_size=4, kernel_block_size=4)
    assert list(got) == [POISON, 50, 60]


def test_copy_blocks_copies_whole_blocks():
    cache = PagedCache(16)
    cache.data[:] = np.arange(16)
    cache.copy_blocks([(1, 3), (1, 2)], block_slots=4)
    assert list(cache.data) == [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7]


def test_copy_blocks_refuses_a_chain(rejects):
    cache = PagedCache(16)
    rejects(cache, ValueError, "block 2 is both a source and a destination",
            cache.copy_blocks, [(1, 2), (2, 3)], 4)


def test_slot_base_lets_huge_block_ids_index_a_small_cache():
    K = 16
    block = 2**31 - 1
    cache = PagedCache(K, slot_base=block * K)
    table = np.array([[block]], np.int32)
    sm = slot_mapping(np.array([0, 3], np.int32), np.arange(3, dtype=np.int64), table, 4,
                      kv_block_size=K, kernel_block_size=K)
    cache.write(sm, np.array([7, 8, 9], np.int64))
    assert list(cache.gather(table[0], 3, kv_block_size=K, kernel_block_size=K)) == [7, 8, 9]


def test_dcp_ranks_together_give_back_the_whole_sequence():
    """docs/contract.md §7: every token on exactly one rank; the ranks' reads together are the sequence."""
    K, B, W, I = 8, 4, 2, 2
    n = 40  # cdiv(40, K*W=16) = 3 blocks
    row = np.array([2, 3, 6, 7, 10, 11, 0, 0], np.int32)  # allocation [1, 3, 5]
    values = np.arange(100, 100 + n, dtype=np.int64)
    qsl = np.array([0, n], np.int32)
    positions = np.arange(n, dtype=np.int64)
    merged = np.full(n, POISON, np.int64)
    for rank in range(W):
        cache = PagedCache(8 * K)
        kw = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_rank=rank, cp_interleave=I)
        cache.write(slot_mapping(qsl, positions, row[None, :], n, **kw), values)
        got = cache.gather(row, n, **kw)
        assert not ((got != POISON) & (merged != POISON)).any()  # no token on two ranks
        merged = np.where(got != POISON, got, merged)
    assert np.array_equal(merged, values)
