"""docs/contract.md §4: the reference slot mapping on every worked example, and its input checks."""

import numpy as np
import pytest

from blocktable.properties.slot.examples import SPEC_EXAMPLES
from blocktable.reference import owner_rank, slot_mapping


@pytest.mark.parametrize("example", SPEC_EXAMPLES, ids=lambda e: e.name)
def test_spec_worked_example(example):
    qsl, positions, table = example.inputs()
    out = slot_mapping(qsl, positions, table, example.tmax, **example.kwargs())
    assert out.dtype == np.int64
    assert np.array_equal(out, example.expected_mapping())


def test_every_token_has_exactly_one_owner_across_ranks():
    """docs/contract.md §7: across DCP ranks every token is owned by exactly one rank."""
    for K, B, W, I in [(16, 16, 2, 1), (128, 64, 2, 128), (32, 16, 4, 8), (64, 16, 8, 16), (16, 8, 4, 16)]:
        positions = np.arange(4 * K * W, dtype=np.int64)
        qsl = np.array([0, len(positions)], dtype=np.int32)
        table = np.arange(1, 1 + 4 * (K // B) + 1, dtype=np.int32)[None, :]
        owners = np.zeros(len(positions), dtype=int)
        for R in range(W):
            out = slot_mapping(qsl, positions, table, len(positions), kv_block_size=K,
                               kernel_block_size=B, cp_world_size=W, cp_rank=R, cp_interleave=I)
            owners += out >= 0
            assert all(owner_rank(int(p), K, W, I) == R for p in positions[out >= 0])
        assert (owners == 1).all(), (K, B, W, I)


def _inputs():
    return (np.array([0, 2], np.int32), np.array([0, 1], np.int64), np.ones((2, 8), np.int32))


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: (a[0].astype(np.int64), a[1], a[2], 4), TypeError, "query_start_loc must be int32, got int64"),
    (lambda a: (a[0], a[1].astype(np.int32), a[2], 4), TypeError, "positions must be int64, got int32"),
    (lambda a: (a[0], a[1], a[2].astype(np.int64), 4), TypeError, "block_table must be int32, got int64"),
    (lambda a: (list(a[0]), a[1], a[2], 4), TypeError, "query_start_loc must be a numpy array, got list"),
    (lambda a: (a[0], a[1], a[2][0], 4), ValueError, "block_table must be 2-D, got shape \\(8,\\)"),
    (lambda a: (a[0], np.array([0, -4], np.int64), a[2], 4), ValueError, "position -4 of token 1 is negative"),
    (lambda a: (np.array([1, 2], np.int32), a[1], a[2], 4), ValueError, "query_start_loc\\[0\\] must be 0, got 1"),
    (lambda a: (np.array([0, 2, 1, 2], np.int32), a[1], np.ones((3, 8), np.int32), 4), ValueError, "query_start_loc decreases at request 1: 2 -> 1"),
    (lambda a: (np.array([0, 1], np.int32), a[1], a[2], 4), ValueError, "query_start_loc\\[N\\] = 1 but there are 2 positions"),
    (lambda a: (a[0], a[1], a[2], 1), ValueError, "2 scheduled tokens exceed max_num_batched_tokens 1"),
    (lambda a: (np.array([0, 0, 1, 1, 2], np.int32), a[1], a[2], 4), ValueError, "4 requests but the block table has only 2 rows"),
    (lambda a: (np.array([], np.int32), a[1], a[2], 4), ValueError, "N\\+1 >= 1 entries"),
])
def test_bad_input_is_rejected(mutate, error, match):
    with pytest.raises(error, match=match):
        slot_mapping(*mutate(_inputs()), kv_block_size=16, kernel_block_size=16)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kv_block_size=24, kernel_block_size=16), ValueError, "kv_block_size 24 must be a positive multiple of kernel_block_size 16"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=2, cp_rank=2), ValueError, "cp_rank 2 is out of range \\[0, 2\\)"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=0, cp_rank=0), ValueError, "cp_world_size must be >= 1, got 0"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=2, cp_interleave=5), ValueError, "cp_interleave 5 must divide kv_block_size 16"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=2, cp_interleave=32), ValueError, "cp_interleave 32"),
    (dict(kv_block_size=16, kernel_block_size=16.0), TypeError, "kernel_block_size must be an int, got float"),
])
def test_bad_configuration_is_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        slot_mapping(*_inputs(), 4, **kwargs)


def test_all_ranks_at_once_equals_rank_by_rank():
    """slot_mappings_all_ranks is slot_mapping for each rank, in one pass."""
    from blocktable.reference import slot_mappings_all_ranks

    rng = np.random.default_rng(3)
    for K, B, W, I in [(16, 16, 1, 1), (128, 64, 2, 128), (32, 16, 4, 8), (12, 4, 8, 3)]:
        qsl = np.array([0, 5, 5, 40], np.int32)
        positions = rng.integers(0, 6 * K * W, size=40).astype(np.int64)
        table = rng.integers(0, 2**31 - 1, size=(4, 7), dtype=np.int64).astype(np.int32)
        every = slot_mappings_all_ranks(qsl, positions, table, 44, kv_block_size=K, kernel_block_size=B,
                                        cp_world_size=W, cp_interleave=I)
        for R in range(W):
            one = slot_mapping(qsl, positions, table, 44, kv_block_size=K, kernel_block_size=B, cp_world_size=W,
                               cp_rank=R, cp_interleave=I)
            assert np.array_equal(every[R], one), (K, B, W, I, R)
