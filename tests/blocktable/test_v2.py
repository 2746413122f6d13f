"""vLLM's V2 block tables (docs/contract.md §10) on our implementation: the worked
examples 1-4 (and example 3's variants), once with our Triton kernels and once with
the torch-native ones, whole buffers compared bit for bit (stale columns, padding rows
and the slot pad included); every rejection leaves state_snapshot() unchanged; G = 0;
the returned tensors are views of the persistent storage. Expected values are worked
out by hand from the SPEC, in the comments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blocktable.checks import data_checks
from blocktable.v2 import TRITON_KERNELS, BlockTables
from blocktable.v2_torch import TORCH_KERNELS

KERNELS = {"triton": TRITON_KERNELS, "torch": TORCH_KERNELS}


@pytest.fixture(params=list(KERNELS))
def kernels(request):
    return KERNELS[request.param]


def i32(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def i64(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def examples_setup(backend, kernels, **kw) -> BlockTables:
    """Examples 1-3: G = 2, Rmax = 4, Tmax = 8, W = 1; g0 K = B = 16, M = 4 (width 4);
    g1 K = 32, B = 16, M = 2 (P = 2, width 4)."""
    return BlockTables([16, 32], 4, 8, [4, 2], kernel_block_sizes=[16, 16], backend=backend, kernels=kernels, **kw)


def host(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy()


def assert_rows(tables, expected) -> None:
    """Whole [Rmax, width] buffers of every group, bit for bit."""
    assert len(tables) == len(expected)
    for g, (t, e) in enumerate(zip(tables, expected)):
        got = host(t)
        assert got.dtype == np.int32
        assert np.array_equal(got, np.array(e, dtype=np.int32)), f"group {g}:\n{got}"


def after_1c(backend, kernels, **kw) -> BlockTables:
    bt = examples_setup(backend, kernels, **kw)
    bt.append_block_ids(2, ([5, 6], [3]), overwrite=True)
    bt.append_block_ids(0, ([9], [4]), overwrite=True)
    bt.apply_staged_writes()
    bt.append_block_ids(2, ([7], [1]), overwrite=False)
    bt.apply_staged_writes()
    return bt


def test_example_1_append_apply_overwrite(backend, kernels, rejects):
    bt = examples_setup(backend, kernels)
    # (a) g1 has P = 2: [3] -> [6, 7], [4] -> [8, 9].
    bt.append_block_ids(2, ([5, 6], [3]), overwrite=True)
    bt.append_block_ids(0, ([9], [4]), True)
    assert bt.staged == [(0, 2, 0, [5, 6]), (1, 2, 0, [6, 7]), (0, 0, 0, [9]), (1, 0, 0, [8, 9])]
    assert np.array_equal(bt.cnt, [[1, 0, 2, 0], [2, 0, 2, 0]]) and bt.cnt.dtype == np.int32
    assert not host(bt.cnt_dev).any()
    assert_rows(bt.rows, [np.zeros((4, 4))] * 2)
    # (b)
    bt.apply_staged_writes()
    assert bt.staged == []
    assert_rows(bt.rows, [[[9, 0, 0, 0], [0] * 4, [5, 6, 0, 0], [0] * 4],
                          [[8, 9, 0, 0], [0] * 4, [6, 7, 0, 0], [0] * 4]])
    assert np.array_equal(host(bt.cnt_dev), [[1, 0, 2, 0], [2, 0, 2, 0]])
    # (c) appends start at the host counts: g0 at 2, g1 at 2; [1] -> [2, 3] fills g1's row.
    bt.append_block_ids(2, ([7], [1]), False)
    assert bt.staged == [(0, 2, 2, [7]), (1, 2, 2, [2, 3])]
    bt.apply_staged_writes()
    assert_rows(bt.rows, [[[9, 0, 0, 0], [0] * 4, [5, 6, 7, 0], [0] * 4],
                          [[8, 9, 0, 0], [0] * 4, [6, 7, 2, 3], [0] * 4]])
    assert np.array_equal(host(bt.cnt_dev), [[1, 0, 3, 0], [2, 0, 4, 0]])
    # (d) g0 would need 1 + 4 = 5 > 4; r = 4 >= Rmax. Counts and staged unchanged.
    rejects(bt, ValueError, "exceed the width 4", bt.append_block_ids, 0, ([1, 2, 3, 4], [5, 6]), False)
    rejects(bt, ValueError, r"\[0, 4\)", bt.append_block_ids, 4, ([1], [1]), True)
    # (e) an empty list with overwrite: the count goes to 0 and the entries stay (stale).
    bt.append_block_ids(2, ([11], []), True)
    assert bt.staged == [(0, 2, 0, [11])]
    assert np.array_equal(bt.cnt, [[1, 0, 1, 0], [2, 0, 0, 0]])
    bt.apply_staged_writes()
    assert_rows(bt.rows, [[[9, 0, 0, 0], [0] * 4, [11, 6, 7, 0], [0] * 4],
                          [[8, 9, 0, 0], [0] * 4, [6, 7, 2, 3], [0] * 4]])
    assert np.array_equal(host(bt.cnt_dev), [[1, 0, 1, 0], [2, 0, 0, 0]])


def test_example_2_gather_permuted_padding_dummy_and_stale_columns(backend, kernels):
    bt = after_1c(backend, kernels)
    # (a) gather([2, 0], 3): b0 <- r2 (n = 3 | 4), b1 <- r0 (n = 1 | 2), b2 zeros, b3 untouched.
    out = bt.gather_block_tables(i32([2, 0], backend.device), 3)
    assert_rows(bt.inp, [[[5, 6, 7, 0], [9, 0, 0, 0], [0] * 4, [0] * 4],
                         [[6, 7, 2, 3], [8, 9, 0, 0], [0] * 4, [0] * 4]])
    assert [tuple(t.shape) for t in out] == [(3, 4), (3, 4)]
    # 1(e), then gather([0, 2, -1], 4) with int64 indices: b0 <- r0 copies [9] | [8, 9] over
    # 2(a)'s [5, 6, 7, 0] | [6, 7, 2, 3] (the rest stale); b1 <- r2 copies [11] | nothing (n = 0:
    # 2(a)'s b1 [8, 9, 0, 0] stays); b2 (-1) and b3 (padding) are zeroed.
    bt.append_block_ids(2, ([11], []), True)
    bt.apply_staged_writes()
    out = bt.gather_block_tables(i64([0, 2, -1], backend.device), 4)
    assert_rows(bt.inp, [[[9, 6, 7, 0], [11, 0, 0, 0], [0] * 4, [0] * 4],
                         [[8, 9, 2, 3], [8, 9, 0, 0], [0] * 4, [0] * 4]])
    assert_rows(out, [host(t) for t in bt.inp])


def test_gather_sees_only_applied_writes_and_duplicates_are_allowed(backend, kernels):
    bt = after_1c(backend, kernels)
    bt.append_block_ids(0, ([1, 2], [3]), False)  # staged, not applied: invisible
    bt.gather_block_tables(i32([0, 0, 2], backend.device), 3)
    assert_rows(bt.inp, [[[9, 0, 0, 0], [9, 0, 0, 0], [5, 6, 7, 0], [0] * 4],
                         [[8, 9, 0, 0], [8, 9, 0, 0], [6, 7, 2, 3], [0] * 4]])


SLOTS_3 = [[95, 96, 120, 149, -1, -1, -1, -1], [111, 112, 40, 133, -1, -1, -1, -1]]


def slots_3(bt, backend, idx=(2, 0)):
    d = backend.device
    return bt.compute_slot_mappings(i32(list(idx), d), i32([0, 3, 5], d), i64([15, 16, 40, 5, 70], d), 6)


def test_example_3_slot_mappings_padding_and_the_guard(backend, kernels):
    bt = after_1c(backend, kernels)
    bt.slots.fill_(7)  # every column must be written, the pad from T = 5 included
    out = slots_3(bt, backend)
    # g0: 15 -> 5*16+15 = 95; 16 -> 6*16 = 96; 40 -> col 2, 7*16+8 = 120; r0: 5 -> 9*16+5 = 149;
    # 70 -> col 4 >= width 4 -> -1. g1: 6*16+15 = 111, 7*16 = 112, 2*16+8 = 40, 8*16+5 = 133, -1.
    assert np.array_equal(host(bt.slots), SLOTS_3) and bt.slots.dtype == torch.int64
    assert tuple(out.shape) == (2, 6) and np.array_equal(host(out), np.array(SLOTS_3)[:, :6])


def test_example_3_variants(backend, kernels):
    # A dummy: tokens 3 and 4 (request 1, idx -1) give -1 in both groups.
    bt = after_1c(backend, kernels)
    slots_3(bt, backend, idx=(2, -1))
    assert np.array_equal(host(bt.slots), [[95, 96, 120, -1, -1, -1, -1, -1], [111, 112, 40, -1, -1, -1, -1, -1]])
    # A disabled group is all -1.
    bt = after_1c(backend, kernels, slot_mapping_enabled=[True, False])
    slots_3(bt, backend)
    assert np.array_equal(host(bt.slots), [SLOTS_3[0], [-1] * 8])
    # int64: row [2**27], position 3 -> 2**27 * 16 + 3 = 2**31 + 3 (vLLM's int32 gives -2147483645).
    bt = BlockTables([16], 1, 4, [1], backend=backend, kernels=kernels)
    bt.append_block_ids(0, ([2**27],), True)
    bt.apply_staged_writes()
    d = backend.device
    bt.compute_slot_mappings(i32([0], d), i32([0, 1], d), i64([3], d), 1)
    assert host(bt.slots).tolist() == [[2147483651, -1, -1, -1]]


@pytest.mark.parametrize("rank, expected_g0", [
    # VB = 64; rank 0 owns vbo in [0, 32), rank 1 [32, 64). Rank 0: 0 -> l 0 -> 10*16 = 160;
    # 16 -> 11*16 = 176; 31 -> 11*16+15 = 191; 64 -> vbi 1, l = 32 -> col 2 -> 18*16 = 288.
    (0, [160, 176, 191, -1, -1, -1, -1, 288, -1, -1]),
    # Rank 1: 32 -> l 0 -> 160; 47 -> 175; 48 -> l 16 -> col 1 -> 176; 63 -> 191; 96 -> l 32 ->
    # col 2 -> 288; 127 -> l 63 -> col 3 -> 19*16+15 = 319.
    (1, [-1, -1, -1, 160, 175, 176, 191, -1, 288, 319]),
])
def test_example_4_dcp_with_a_kernel_block_smaller_than_the_allocation_block(backend, kernels, rank, expected_g0):
    bt = BlockTables([32, 16], 1, 16, [2, 8], kernel_block_sizes=[16, 16], cp_size=2, cp_rank=rank,
                     cp_interleave=32, dcp_sharded=[True, False], backend=backend, kernels=kernels)
    bt.append_block_ids(0, ([5, 9], list(range(20, 28))), True)
    bt.apply_staged_writes()
    assert_rows(bt.rows, [[[10, 11, 18, 19]], [list(range(20, 28))]])
    d = backend.device
    positions = [0, 16, 31, 32, 47, 48, 63, 64, 96, 127]
    bt.compute_slot_mappings(i32([0], d), i32([0, 10], d), i64(positions, d), 16)
    # g1 is replicated: p // 16 -> 20 + col, e.g. 127 -> 27*16+15 = 447.
    g1 = [320, 336, 351, 352, 367, 368, 383, 384, 416, 447]
    assert np.array_equal(host(bt.slots), [expected_g0 + [-1] * 6, g1 + [-1] * 6])


def test_example_4_a_sharded_group_with_interleave_past_its_block_is_rejected(backend, kernels):
    with pytest.raises(ValueError, match="group 1 is sharded"):
        BlockTables([32, 16], 1, 16, [2, 8], kernel_block_sizes=[16, 16], cp_size=2, cp_rank=0,
                    cp_interleave=32, backend=backend, kernels=kernels)


@pytest.mark.parametrize("args, kw, error, match", [
    (([16, 32], 4, 8, [4]), {}, ValueError, "differ in length"),
    (([16], 4, 8, [4]), {"kernel_block_sizes": [16, 16]}, ValueError, "differ in length"),
    (([16], 4, 8, [4]), {"dcp_sharded": [True, False]}, ValueError, "differ in length"),
    (([16], 4, 8, [4]), {"slot_mapping_enabled": []}, ValueError, "differ in length"),
    (([0], 4, 8, [4]), {}, ValueError, "block_sizes must be >= 1"),
    (([16], 4, 8, [4]), {"kernel_block_sizes": [0]}, ValueError, "kernel_block_sizes must be >= 1"),
    (([16], 4, 8, [0]), {}, ValueError, "max_num_blocks_per_group must be >= 1"),
    (([16], 0, 8, [4]), {}, ValueError, "max_num_reqs must be >= 1"),
    (([16], 4, 0, [4]), {}, ValueError, "max_num_batched_tokens must be >= 1"),
    (([48], 4, 8, [4]), {"kernel_block_sizes": [32]}, ValueError, "not a multiple"),
    (([16], 4, 8, [4]), {"cp_size": 0}, ValueError, "cp_size must be >= 1"),
    (([16], 4, 8, [4]), {"cp_size": 2, "cp_rank": 2}, ValueError, "cp_rank 2"),
    (([16], 4, 8, [4]), {"cp_rank": -1}, ValueError, "cp_rank -1"),
    (([16], 4, 8, [4]), {"cp_interleave": 0}, ValueError, "cp_interleave must be >= 1"),
    (([16], 4, 8, [4]), {"cp_size": 2, "cp_interleave": 32}, ValueError, "sharded"),
    (([48], 4, 8, [4]), {"cp_size": 2, "cp_interleave": 32}, ValueError, "sharded"),
    (([16], 4.0, 8, [4]), {}, TypeError, "max_num_reqs must be an int"),
    (([16], 4, 8, [4]), {"dcp_sharded": [1]}, TypeError, "bools"),
])
def test_construction_rejects(backend, args, kw, error, match):
    with pytest.raises(error, match=match):
        BlockTables(*args, backend=backend, **kw)


def test_construction_accepts_what_the_rules_allow(backend):
    # I > K in a replicated group, or with W = 1, is fine; so is I = K.
    bt = BlockTables([16, 32], 2, 4, [1, 1], cp_size=2, cp_interleave=32, dcp_sharded=[False, True],
                     backend=backend)
    assert bt.widths == [1, 1] and bt.kernel_block_sizes == [16, 32] and bt.enabled == [True, True]
    bt = BlockTables([16], 2, 4, [3], kernel_block_sizes=[4], cp_interleave=64, backend=backend)
    assert bt.widths == [12] and bt.sharded == [True] and bt.num_groups == 1
    assert (bt.max_num_reqs, bt.max_num_batched_tokens, bt.cp_size, bt.cp_rank, bt.cp_interleave) == (2, 4, 1, 0, 64)
    snap = bt.state_snapshot()
    assert not snap["rows"][0].any() and not snap["slots"].any() and snap["staged"] == []


@pytest.mark.parametrize("r, ids, match", [
    (-1, ([1], [1]), r"\[0, 4\)"), (1.0, ([1], [1]), r"\[0, 4\)"), (True, ([1], [1]), r"\[0, 4\)"),
    (0, ([1],), "2 groups"), (0, ([1], [1], [1]), "2 groups"), (0, None, "one id list per group"),
    (0, ([-1], [1]), "does not fit"), (0, ([1], [1.5]), "not an int"), (0, ([True], [1]), "not an int"),
    # g1 has P = 2: b*2 + 1 <= 2**31 - 1 allows b up to 2**30 - 1; g0 (P = 1) allows 2**31 - 1.
    (0, ([1], [2**30]), "does not fit"), (0, ([2**31], [1]), "does not fit"),
    (0, ([], [1, 2, 3]), "exceed the width 4"),  # 6 kernel blocks in g1
])
def test_append_rejects_and_changes_nothing(backend, kernels, rejects, r, ids, match):
    bt = after_1c(backend, kernels)
    bt.append_block_ids(1, ([3], []), True)  # something staged, to be kept
    rejects(bt, ValueError, match, bt.append_block_ids, r, ids, True)


def test_append_accepts_the_largest_ids_and_fills_rows_to_the_width(backend, kernels):
    bt = examples_setup(backend, kernels)
    bt.append_block_ids(3, ([2**31 - 1, 1, 2, 3], [2**30 - 1, 4]), True)
    bt.apply_staged_writes()
    assert_rows(bt.rows, [[[0] * 4] * 3 + [[2**31 - 1, 1, 2, 3]],
                          [[0] * 4] * 3 + [[2**31 - 2, 2**31 - 1, 8, 9]]])


def test_two_writes_to_one_row_before_apply_land_in_staging_order(backend, kernels):
    """A second append starts at the updated host count; overlapping overwrites:
    the later write wins (§10.4's reading)."""
    bt = examples_setup(backend, kernels)
    bt.append_block_ids(1, ([1, 2, 3], [4]), True)
    bt.append_block_ids(1, ([5], [6]), False)  # g0 at 3, g1 at 2
    bt.append_block_ids(2, ([7, 8, 9], [1, 2]), True)
    bt.append_block_ids(2, ([10], []), True)  # overwrites column 0 of g0 only; g1's count -> 0
    bt.apply_staged_writes()
    assert_rows(bt.rows, [[[0] * 4, [1, 2, 3, 5], [10, 8, 9, 0], [0] * 4],
                          [[0] * 4, [8, 9, 12, 13], [2, 3, 4, 5], [0] * 4]])
    assert np.array_equal(host(bt.cnt_dev), [[0, 4, 1, 0], [0, 4, 0, 0]])


def test_apply_with_nothing_staged_still_snapshots_the_counts(backend, kernels):
    bt = after_1c(backend, kernels)
    bt.append_block_ids(2, ([], []), True)  # counts only
    assert bt.staged == []
    bt.apply_staged_writes()
    assert np.array_equal(host(bt.cnt_dev), [[1, 0, 0, 0], [2, 0, 0, 0]])


def test_gather_rejects_and_changes_nothing(backend, kernels, rejects):
    bt = after_1c(backend, kernels)
    bt.gather_block_tables(i32([2, 0], backend.device), 3)
    d = backend.device
    rejects(bt, TypeError, "int32 or int64", bt.gather_block_tables, torch.tensor([0.0], device=d), 1)
    rejects(bt, TypeError, "1-D", bt.gather_block_tables, i32([[0]], d), 1)
    rejects(bt, TypeError, "torch.Tensor", bt.gather_block_tables, [0], 1)
    rejects(bt, ValueError, "more than num_reqs_padded", bt.gather_block_tables, i32([0, 1], d), 1)
    rejects(bt, ValueError, r"num_reqs_padded 5 is out of range \[0, 4\]", bt.gather_block_tables, i32([0], d), 5)
    rejects(bt, TypeError, "num_reqs_padded must be an int", bt.gather_block_tables, i32([0], d), 1.0)
    rejects(bt, ValueError, r"idx_mapping\[1\] = 4", bt.gather_block_tables, i32([0, 4], d), 2)
    rejects(bt, ValueError, r"idx_mapping\[0\] = -2", bt.gather_block_tables, i64([-2], d), 2)


def test_gather_on_the_wrong_device_is_a_type_error(backend, kernels, rejects):
    bt = after_1c(backend, kernels)
    if backend.device.type == "cpu":
        if not torch.cuda.is_available():
            pytest.skip("no second device type to pass")
        wrong = torch.zeros(1, dtype=torch.int32, device="cuda")
    else:
        wrong = torch.zeros(1, dtype=torch.int32)
    rejects(bt, TypeError, "is on", bt.gather_block_tables, wrong, 1)


def test_slot_mappings_reject_and_change_nothing(backend, kernels, rejects):
    bt = after_1c(backend, kernels)
    slots_3(bt, backend)
    d = backend.device
    idx, qsl, pos = i32([2, 0], d), i32([0, 3, 5], d), i64([15, 16, 40, 5, 70], d)
    call = bt.compute_slot_mappings
    rejects(bt, ValueError, r"idx_mapping\[0\] = 9", call, i32([9, 0], d), qsl, pos, 6)
    rejects(bt, TypeError, "int32 or int64", call, idx.to(torch.int16), qsl, pos, 6)
    rejects(bt, TypeError, "query_start_loc must be torch.int32", call, idx, qsl.to(torch.int64), pos, 6)
    rejects(bt, TypeError, "positions must be torch.int64", call, idx, qsl, pos.to(torch.int32), 6)
    rejects(bt, ValueError, "3 entries; 3 requests need 4", call, i32([2, 0, 1], d), qsl, pos, 6)
    rejects(bt, ValueError, r"query_start_loc\[0\] must be 0", call, idx, i32([1, 3, 5], d), pos, 6)
    rejects(bt, ValueError, "decreases at request 1: 3 -> 2", call, idx, i32([0, 3, 2], d), pos, 6)
    rejects(bt, ValueError, "exceeds num_tokens_padded 4", call, idx, qsl, pos, 4)
    rejects(bt, ValueError, r"num_tokens_padded 9 is out of range \[0, 8\]", call, idx, qsl, pos, 9)
    rejects(bt, ValueError, r"num_tokens_padded -1 is out of range", call, idx, qsl, pos, -1)
    rejects(bt, ValueError, "fewer than T = 5", call, idx, qsl, pos[:4], 6)
    rejects(bt, ValueError, "position -3 of token 2", call, idx, qsl, i64([15, 16, -3, 5, 70], d), 6)


def test_a_negative_position_past_T_is_never_read(backend, kernels):
    """Only positions[:T] are read, in the small path and in the large one (a
    positions tensor above blocktable.checks.SMALL_BATCH sends back one index)."""
    bt = after_1c(backend, kernels)
    d = backend.device
    for length in (6, 5000):
        pos = torch.full((length,), -1, dtype=torch.int64, device=d)
        pos[:5] = i64([15, 16, 40, 5, 70], d)
        bt.compute_slot_mappings(i32([2, 0], d), i32([0, 3, 5], d), pos, 6)
        assert np.array_equal(host(bt.slots), SLOTS_3)
        pos[3] = -5
        with pytest.raises(ValueError, match="of token 3 is negative"):
            bt.compute_slot_mappings(i32([2, 0], d), i32([0, 3, 5], d), pos, 6)


def test_data_checks_off_skips_only_the_data_dependent_checks(backend, kernels, rejects):
    bt = after_1c(backend, kernels)
    d = backend.device
    with data_checks(False):
        rejects(bt, ValueError, "more than num_reqs_padded", bt.gather_block_tables, i32([0, 1], d), 1)
        bt.gather_block_tables(i32([2, 0], d), 3)  # valid data runs as with the checks on
        assert_rows(bt.inp, [[[5, 6, 7, 0], [9, 0, 0, 0], [0] * 4, [0] * 4],
                             [[6, 7, 2, 3], [8, 9, 0, 0], [0] * 4, [0] * 4]])
        slots_3(bt, backend)
        assert np.array_equal(host(bt.slots), SLOTS_3)


def test_dummies_and_views_of_the_persistent_storage(backend, kernels, rejects):
    bt = after_1c(backend, kernels)
    d = backend.device
    out = bt.gather_block_tables(i32([2, 0], d), 3)
    assert [t.data_ptr() for t in out] == [t.data_ptr() for t in bt.inp]
    slots = slots_3(bt, backend)
    assert slots.data_ptr() == bt.slots.data_ptr() and slots.stride() == bt.slots.stride()
    # get_dummy_block_tables(1): row 0 of every group zeroed, row 1 keeps r0's gathered row.
    dummy = bt.get_dummy_block_tables(1)
    assert [t.data_ptr() for t in dummy] == [t.data_ptr() for t in bt.inp]
    assert [tuple(t.shape) for t in dummy] == [(1, 4), (1, 4)]
    assert_rows(bt.inp, [[[0] * 4, [9, 0, 0, 0], [0] * 4, [0] * 4], [[0] * 4, [8, 9, 0, 0], [0] * 4, [0] * 4]])
    dummy = bt.get_dummy_slot_mappings(3)
    assert dummy.data_ptr() == bt.slots.data_ptr() and tuple(dummy.shape) == (2, 3)
    assert np.array_equal(host(bt.slots), np.full((2, 8), -1))
    assert bt.get_dummy_block_tables(0)[0].shape == (0, 4)
    rejects(bt, ValueError, r"n 5 is out of range \[0, 4\]", bt.get_dummy_block_tables, 5)
    rejects(bt, ValueError, r"n 9 is out of range \[0, 8\]", bt.get_dummy_slot_mappings, 9)
    rejects(bt, ValueError, r"n -1 is out of range", bt.get_dummy_slot_mappings, -1)


def test_no_groups_everything_is_a_no_op(backend, kernels, rejects):
    bt = BlockTables([], 3, 5, [], backend=backend, kernels=kernels)
    d = backend.device
    assert bt.num_groups == 0 and bt.rows == [] and bt.inp == [] and bt.cnt.shape == (0, 3)
    bt.append_block_ids(1, (), True)
    assert bt.staged == []
    bt.apply_staged_writes()
    assert bt.gather_block_tables(i32([0, -1], d), 3) == ()
    assert bt.get_dummy_block_tables(2) == ()
    slots = bt.compute_slot_mappings(i32([1], d), i32([0, 2], d), i64([0, 1], d), 4)
    assert tuple(slots.shape) == (0, 4) and tuple(bt.get_dummy_slot_mappings(5).shape) == (0, 5)
    rejects(bt, ValueError, "0 groups", bt.append_block_ids, 0, ([1],), True)
    snap = bt.state_snapshot()
    assert snap["rows"] == [] and snap["slots"].shape == (0, 5) and snap["cnt_dev"].shape == (0, 3)


def test_the_state_lives_on_the_backend_device(backend):
    bt = examples_setup(backend, None)
    for t in (*bt.rows, *bt.inp, bt.cnt_dev, bt.slots):
        assert t.device.type == backend.device.type
    assert [t.dtype for t in (bt.rows[0], bt.inp[0], bt.cnt_dev, bt.slots)] == [torch.int32] * 3 + [torch.int64]
    assert isinstance(bt.cnt, np.ndarray)
    assert bt.kernels is TRITON_KERNELS
