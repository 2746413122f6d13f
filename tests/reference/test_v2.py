"""docs/contract.md §10 on the reference: vLLM's model-runner-V2 block tables.

Every worked example of §10 is a test here, then one test per rule: the no-group table,
construction errors, rejected calls that change nothing, the staging rules, what the
step calls read, duplicates, views, the int64 slot.

The expected values are computed by hand in the comments, from the contract's
arithmetic; none of them comes from running the reference. Whole arrays are compared,
every row and column (stale parts included) and the dtype.

Setup of examples 1-3 (`tables()`): G = 2, Rmax = 4, Tmax = 8, W = 1;
g0: K = B = 16, M = 4 (P = 1, width 4); g1: K = 32, B = 16, M = 2 (P = 2, width 4).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from blocktable.reference import V2BlockTables

PAD = -1


def tables(**kw: Any) -> V2BlockTables:
    """The setup of §10's examples 1-3."""
    return V2BlockTables([16, 32], 4, 8, [4, 2], kernel_block_sizes=[16, 16], **kw)


def i32(rows: list) -> np.ndarray:
    return np.array(rows, dtype=np.int32)


def i64(rows: list) -> np.ndarray:
    return np.array(rows, dtype=np.int64)


def assert_array(got: np.ndarray, expected: np.ndarray) -> None:
    """Bit for bit: same dtype, same shape, same values."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert np.array_equal(got, expected), f"\n{got}\n!=\n{expected}"


def assert_view(got: np.ndarray, storage: np.ndarray) -> None:
    """The result is the persistent buffer itself: same memory, same first element."""
    assert got.__array_interface__["data"][0] == storage.__array_interface__["data"][0]
    if got.size:
        assert np.shares_memory(got, storage)


def same(a: Any, b: Any) -> bool:
    """Deep, bit-for-bit equality of a state snapshot (arrays by dtype, shape and value)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def snapshot(bt: V2BlockTables) -> dict[str, Any]:
    return copy.deepcopy(vars(bt))


# The steps of example 1, replayed by the later examples (each asserted in its own test).

def step_1a(bt: V2BlockTables) -> None:
    bt.append_block_ids(2, ([5, 6], [3]), overwrite=True)
    bt.append_block_ids(0, ([9], [4]), overwrite=True)


def step_1b(bt: V2BlockTables) -> None:
    bt.apply_staged_writes()


def step_1c(bt: V2BlockTables) -> None:
    bt.append_block_ids(2, ([7], [1]), overwrite=False)
    bt.apply_staged_writes()


def step_1e(bt: V2BlockTables) -> None:
    bt.append_block_ids(2, ([11], []), overwrite=True)
    bt.apply_staged_writes()


def after_1c(**kw: Any) -> V2BlockTables:
    bt = tables(**kw)
    step_1a(bt)
    step_1b(bt)
    step_1c(bt)
    return bt


ZERO_ROWS = i32([[0, 0, 0, 0]] * 4)
ZERO_SLOTS = i64([[0] * 8] * 2)


# -- example 1: append, apply, overwrite -------------------------------------------------------------


def test_example_1a_append_stages_and_moves_only_the_host_counts():
    """§10 example 1(a). Risky: the host count runs ahead of what the kernels see. An append
    that writes `rows` at once, or a kernel that reads `cnt` instead of `cnt_dev`, shows blocks
    that are not on the device yet; a hybrid group (P = 2) must stage kernel ids, not block ids.

    1. append(2, ([5, 6], [3]), overwrite=True): g0 starts at 0 and stages [5, 6] (P = 1),
       end 2; g1 starts at 0, block 3 -> kernel ids 3*2, 3*2+1 = [6, 7], end 2.
    2. append(0, ([9], [4]), True): g0 stages [9], end 1; g1 block 4 -> [8, 9], end 2.
    3. Host counts: cnt[g, r] = end_g. Nothing else changes.
    """
    bt = tables()
    step_1a(bt)
    assert bt.staged == [(0, 2, 0, [5, 6]), (1, 2, 0, [6, 7]), (0, 0, 0, [9]), (1, 0, 0, [8, 9])]
    # cnt = [1 0 2 0; 2 0 2 0]
    assert_array(bt.cnt, i32([[1, 0, 2, 0], [2, 0, 2, 0]]))
    # cnt_dev, rows, inp and slots are still all zero.
    assert_array(bt.cnt_dev, i32([[0, 0, 0, 0], [0, 0, 0, 0]]))
    for g in range(2):
        assert_array(bt.rows[g], ZERO_ROWS)
        assert_array(bt.inp[g], ZERO_ROWS)
    assert_array(bt.slots, ZERO_SLOTS)


def test_example_1b_apply_lands_the_writes_and_snapshots_the_counts():
    """§10 example 1(b). Risky: the writes of several groups and rows land in one launch; a
    wrong row offset or group puts ids in another request's row.

    1. The four staged writes of 1(a) land in order: rows[0][2, 0:2] = [5, 6],
       rows[1][2, 0:2] = [6, 7], rows[0][0, 0:1] = [9], rows[1][0, 0:2] = [8, 9].
    2. staged becomes empty; cnt_dev = cnt.
    """
    bt = tables()
    step_1a(bt)
    step_1b(bt)
    assert bt.staged == []
    #                         r0            r1            r2            r3
    assert_array(bt.rows[0], i32([[9, 0, 0, 0], [0, 0, 0, 0], [5, 6, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.rows[1], i32([[8, 9, 0, 0], [0, 0, 0, 0], [6, 7, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[1, 0, 2, 0], [2, 0, 2, 0]]))
    assert_array(bt.cnt, i32([[1, 0, 2, 0], [2, 0, 2, 0]]))


def test_example_1c_append_without_overwrite_starts_at_the_host_count():
    """§10 example 1(c). Risky: a non-overwriting append starts at each group's own host
    count, in kernel entries (g1's 2 entries are one allocation block); g1's row ends exactly
    full, which an off-by-one width check refuses.

    1. append(2, ([7], [1]), False): g0 start cnt[0, 2] = 2, stages (0, 2, 2, [7]), end 3;
       g1 start cnt[1, 2] = 2, block 1 -> [2, 3], stages (1, 2, 2, [2, 3]), end 4 = width.
    2. apply: rows[0][2] = [5, 6, 7, 0], rows[1][2] = [6, 7, 2, 3];
       cnt_dev = [1 0 3 0; 2 0 4 0].
    """
    bt = tables()
    step_1a(bt)
    step_1b(bt)
    bt.append_block_ids(2, ([7], [1]), overwrite=False)
    assert bt.staged == [(0, 2, 2, [7]), (1, 2, 2, [2, 3])]
    assert_array(bt.cnt, i32([[1, 0, 3, 0], [2, 0, 4, 0]]))
    assert_array(bt.cnt_dev, i32([[1, 0, 2, 0], [2, 0, 2, 0]]))  # as of 1(b)
    bt.apply_staged_writes()
    assert bt.staged == []
    assert_array(bt.rows[0], i32([[9, 0, 0, 0], [0, 0, 0, 0], [5, 6, 7, 0], [0, 0, 0, 0]]))
    assert_array(bt.rows[1], i32([[8, 9, 0, 0], [0, 0, 0, 0], [6, 7, 2, 3], [0, 0, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[1, 0, 3, 0], [2, 0, 4, 0]]))


def test_example_1d_overflow_and_a_bad_slot_are_rejected_and_change_nothing():
    """§10 example 1(d). Risky: vLLM checks the width only after staging earlier groups (and
    only since #50493), so a refused append leaves half a write behind.

    1. append(0, ([1, 2, 3, 4], [5, 6]), False): g0 starts at cnt[0, 0] = 1 and would end at
       1 + 4 = 5 > width 4 -> ValueError. (g1 would end at 2 + 4 = 6 > 4 too.)
    2. append(4, ([1], [1]), True): r = 4 >= Rmax = 4 -> ValueError.
    3. After each, the whole state (counts, staged, rows, inp, slots) is as before.
    """
    bt = after_1c()
    bt.append_block_ids(1, ([3], [3]), overwrite=True)  # something staged, so `staged` is compared
    before = snapshot(bt)
    with pytest.raises(ValueError, match="group 0, slot 0: 4 kernel ids from column 1 end at 5, past width 4"):
        bt.append_block_ids(0, ([1, 2, 3, 4], [5, 6]), overwrite=False)
    assert same(snapshot(bt), before)
    with pytest.raises(ValueError, match=r"r must be a slot in \[0, 4\), got int 4"):
        bt.append_block_ids(4, ([1], [1]), overwrite=True)
    assert same(snapshot(bt), before)


def test_example_1e_overwrite_with_an_empty_list_resets_the_count_and_keeps_the_entries():
    """§10 example 1(e). Risky: an overwrite rewrites from column 0 but never clears, so the
    entries past the new count stay (stale) and must stay; a group with no new ids stages
    nothing yet still resets its count, which only apply's snapshot carries to cnt_dev.

    1. append(2, ([11], []), True): g0 stages (0, 2, 0, [11]), cnt[0, 2] = 1;
       g1 stages nothing, cnt[1, 2] = 0 + 0 = 0.
    2. apply: rows[0][2] = [11, 6, 7, 0] (6, 7 stale); rows[1][2] = [6, 7, 2, 3] unchanged;
       cnt_dev = [1 0 1 0; 2 0 0 0].
    """
    bt = after_1c()
    bt.append_block_ids(2, ([11], []), overwrite=True)
    assert bt.staged == [(0, 2, 0, [11])]
    assert_array(bt.cnt, i32([[1, 0, 1, 0], [2, 0, 0, 0]]))
    bt.apply_staged_writes()
    assert_array(bt.rows[0], i32([[9, 0, 0, 0], [0, 0, 0, 0], [11, 6, 7, 0], [0, 0, 0, 0]]))
    assert_array(bt.rows[1], i32([[8, 9, 0, 0], [0, 0, 0, 0], [6, 7, 2, 3], [0, 0, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[1, 0, 1, 0], [2, 0, 0, 0]]))
    assert bt.staged == []


# -- example 2: gather -------------------------------------------------------------------------------


def test_example_2a_gather_permutes_rows_into_batch_order_and_zeroes_padding():
    """§10 example 2(a). Risky: the gather reads by slot and writes by batch position; a kernel
    that copies whole rows instead of cnt_dev entries, indexes `inp` by slot, or skips the
    padding rows hands attention the wrong blocks.

    On the state after 1(c) (cnt_dev = [1 0 3 0; 2 0 4 0]), gather([2, 0], 3):
    1. b0 <- r2: g0 n = 3, inp[0][0, :3] = [5, 6, 7], col 3 stays 0; g1 n = 4, [6, 7, 2, 3].
    2. b1 <- r0: g0 n = 1, [9] then stays 0, 0, 0; g1 n = 2, [8, 9] then 0, 0.
    3. b2 (N = 2 <= b < 3): zeros over the group's width.
    4. b3 (>= num_reqs_padded): untouched, still 0.
    5. The result is (inp[0][:3], inp[1][:3]).
    """
    bt = after_1c()
    out = bt.gather_block_tables(i32([2, 0]), 3)
    assert_array(bt.inp[0], i32([[5, 6, 7, 0], [9, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.inp[1], i32([[6, 7, 2, 3], [8, 9, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert type(out) is tuple and len(out) == 2
    for g in range(2):
        assert_array(out[g], bt.inp[g][:3].copy())
        assert_view(out[g], bt.inp[g])
    # The gather reads rows and cnt_dev; it changes neither, nor the counts or slots.
    assert_array(bt.rows[0], i32([[9, 0, 0, 0], [0, 0, 0, 0], [5, 6, 7, 0], [0, 0, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[1, 0, 3, 0], [2, 0, 4, 0]]))
    assert_array(bt.slots, ZERO_SLOTS)


def test_example_2b_gather_keeps_stale_columns_and_gives_a_dummy_a_zero_row():
    """§10 example 2(b). Risky: entries past cnt_dev in `inp` are not written, so they hold the
    previous step's values; a kernel that zeroes them, or that reads row -1 for a dummy
    (vLLM reads out of bounds there), differs.

    1. Replay 1(a)-(c), 2(a) (which fills inp), 1(d) (both refused), 1(e):
       cnt_dev = [1 0 1 0; 2 0 0 0], rows[0][2] = [11, 6, 7, 0], rows[1][2] = [6, 7, 2, 3].
    2. gather([0, 2, -1], 4), idx as int64:
       - b0 <- r0: g0 n = 1 -> [9] over 2(a)'s b0 [5, 6, 7, 0] -> [9, 6, 7, 0];
                   g1 n = 2 -> [8, 9] over [6, 7, 2, 3] -> [8, 9, 2, 3].
       - b1 <- r2: g0 n = 1 -> [11] over 2(a)'s b1 [9, 0, 0, 0] -> [11, 0, 0, 0];
                   g1 n = 0 -> nothing written, 2(a)'s b1 stays: [8, 9, 0, 0].
       - b2 (-1, a dummy): zeros (a reading: a dummy owns no blocks).
       - b3 (N = 3 <= b < 4, padding): zeros.
    """
    bt = after_1c()
    bt.gather_block_tables(i32([2, 0]), 3)  # 2(a)
    with pytest.raises(ValueError):
        bt.append_block_ids(0, ([1, 2, 3, 4], [5, 6]), overwrite=False)  # 1(d)
    with pytest.raises(ValueError):
        bt.append_block_ids(4, ([1], [1]), overwrite=True)
    step_1e(bt)
    out = bt.gather_block_tables(i64([0, 2, -1]), 4)
    assert_array(bt.inp[0], i32([[9, 6, 7, 0], [11, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.inp[1], i32([[8, 9, 2, 3], [8, 9, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    for g in range(2):
        assert_array(out[g], bt.inp[g].copy())
        assert_view(out[g], bt.inp[g])


# -- example 3: slot mappings ------------------------------------------------------------------------


EXAMPLE_3: dict[str, Any] = {"idx": i32([2, 0]), "qsl": i32([0, 3, 5]), "positions": i64([15, 16, 40, 5, 70]), "padded": 6}


def slot_mappings(bt: V2BlockTables, idx: np.ndarray, qsl: np.ndarray, positions: np.ndarray,
                  padded: int) -> np.ndarray:
    return bt.compute_slot_mappings(idx, qsl, positions, padded)


def test_example_3_slot_mappings_with_padding_and_the_column_guard():
    """§10 example 3. Risky: the kernel reads `rows` by slot through idx_mapping, multiplies a
    block id by B, and must stop at the row's width: vLLM's load for column 4 of a width-4 row
    reads the next row (r1: 0) and gives 0*16 + 70 % 16 = 6 instead of -1 (#54296).

    On the state after 1(c): idx = [2, 0], qsl = [0, 3, 5], positions = [15, 16, 40, 5, 70],
    num_tokens_padded = 6, so T = 5.
    1. g0 (B = 16, W = 1, so l = p, col = p // 16), r2 = [5, 6, 7, 0], r0 = [9, 0, 0, 0]:
       15 -> col 0 -> 5*16 + 15 = 95; 16 -> col 1 -> 6*16 + 0 = 96; 40 -> col 2 -> 7*16 + 8 = 120;
       r0: 5 -> col 0 -> 9*16 + 5 = 149; 70 -> col 4 >= width 4 -> -1.
    2. g1 (B = 16), r2 = [6, 7, 2, 3], r0 = [8, 9, 0, 0]:
       15 -> 6*16 + 15 = 111; 16 -> 7*16 = 112; 40 -> col 2 -> 2*16 + 8 = 40;
       5 -> 8*16 + 5 = 133; 70 -> -1.
       (In allocation blocks: block 3 -> 3*32 + 15 = 111, 3*32 + 16 = 112; block 1 -> 1*32 + 8
       = 40; block 4 -> 4*32 + 5 = 133.)
    3. slots[g, 5:8] = -1: the pad starts at T = 5, and runs to Tmax = 8, past the padded 6.
    4. The result is slots[:, :6].
    """
    bt = after_1c()
    out = slot_mappings(bt, **EXAMPLE_3)
    assert_array(bt.slots, i64([[95, 96, 120, 149, PAD, PAD, PAD, PAD],
                                [111, 112, 40, 133, PAD, PAD, PAD, PAD]]))
    assert_array(out, bt.slots[:, :6].copy())
    assert_view(out, bt.slots)
    # The slot mapping reads rows; it writes nothing else.
    assert_array(bt.inp[0], ZERO_ROWS)
    assert_array(bt.cnt_dev, i32([[1, 0, 3, 0], [2, 0, 4, 0]]))


def test_example_3_variant_a_dummy_request_maps_to_pad():
    """§10 example 3, `idx = [2, -1]`. Risky: before #56734 vLLM read row -1 for a dummy.

    1. Tokens 0-2 are r2's, as in example 3: g0 95, 96, 120; g1 111, 112, 40.
    2. Tokens 3 and 4 belong to the dummy: -1 in both groups, whatever their positions.
    3. Tail 5:8 is -1.
    """
    bt = after_1c()
    slot_mappings(bt, **{**EXAMPLE_3, "idx": i32([2, -1])})
    assert_array(bt.slots, i64([[95, 96, 120, PAD, PAD, PAD, PAD, PAD],
                                [111, 112, 40, PAD, PAD, PAD, PAD, PAD]]))


def test_example_3_variant_a_disabled_group_gets_no_slots():
    """§10 example 3, `enabled = [True, False]`. Risky: a disabled group's builder maps its own
    slots (ring buffers, tails); a kernel that maps it anyway, or leaves it unwritten (here
    it starts at 0), hands the wrong slots on.

    1. g0 as in example 3: 95, 96, 120, 149, -1, then the tail -1.
    2. g1 is disabled: slots[1, :5] = -1 and the tail -1: the whole row is -1.
    """
    bt = after_1c(slot_mapping_enabled=[True, False])
    slot_mappings(bt, **EXAMPLE_3)
    assert_array(bt.slots, i64([[95, 96, 120, 149, PAD, PAD, PAD, PAD], [PAD] * 8]))


def test_example_3_variant_the_slot_is_computed_in_int64():
    """§10 example 3, int64. Risky: vLLM multiplies block id by B in int32, so a block id of
    2**27 times 16 wraps: 2**31 + 3 becomes -2147483645.

    1. One group, K = B = 16, M = 1; append(0, ([2**27],), True), apply: rows[0][0] = [134217728].
    2. idx = [0], qsl = [0, 1], positions = [3]: col 0 -> 2**27 * 16 + 3 = 2**31 + 3 = 2147483651.
    """
    bt = V2BlockTables([16], 1, 4, [1])
    bt.append_block_ids(0, ([2**27],), overwrite=True)
    bt.apply_staged_writes()
    assert_array(bt.rows[0], i32([[134217728]]))
    out = bt.compute_slot_mappings(i32([0]), i32([0, 1]), i64([3]), 1)
    assert_array(bt.slots, i64([[2147483651, PAD, PAD, PAD]]))
    assert_array(out, i64([[2147483651]]))


# -- example 4: DCP with B < K ------------------------------------------------------------------------


def example_4(rank: int, sharded: tuple[bool, bool] = (True, False)) -> V2BlockTables:
    """W = 2, I = 32, Rmax = 1, Tmax = 16; g0 K = 32, B = 16, M = 2 (sharded, P = 2, width 4);
    g1 K = B = 16, M = 8 (replicated, width 8)."""
    return V2BlockTables([32, 16], 1, 16, [2, 8], kernel_block_sizes=[16, 16], cp_size=2, cp_rank=rank,
                         cp_interleave=32, dcp_sharded=list(sharded))


EXAMPLE_4_POSITIONS = [0, 16, 31, 32, 47, 48, 63, 64, 96, 127]
# g1 is replicated (l = p, col = p // 16) over row [20..27], the same on both ranks:
# 0 -> 20*16 = 320; 16 -> 21*16 = 336; 31 -> 336 + 15 = 351; 32 -> 22*16 = 352; 47 -> 367;
# 48 -> 23*16 = 368; 63 -> 383; 64 -> 24*16 = 384; 96 -> col 6 -> 26*16 = 416; 127 -> col 7 -> 27*16 + 15 = 447.
EXAMPLE_4_G1 = [320, 336, 351, 352, 367, 368, 383, 384, 416, 447]
EXAMPLE_4_G0 = {
    # Rank 0 owns vbo in [0, 32) of each virtual block of VB = K*W = 64 positions:
    # 0 -> l 0 -> col 0 -> 10*16 = 160; 16 -> l 16 -> col 1 -> 11*16 = 176; 31 -> 176 + 15 = 191;
    # 32..63 are rank 1's -> -1; 64 -> vbi 1, vbo 0 -> l = 1*32 + 0 = 32 -> col 2 -> 18*16 = 288;
    # 96 and 127 (vbo 32, 63) are rank 1's -> -1.
    0: [160, 176, 191, PAD, PAD, PAD, PAD, 288, PAD, PAD],
    # Rank 1 owns vbo in [32, 64): 32 -> l = (32 // 64)*32 + 32 % 32 = 0 -> col 0 -> 160;
    # 47 -> l 15 -> 175; 48 -> l 16 -> col 1 -> 11*16 = 176; 63 -> l 31 -> 191;
    # 96 -> vbi 1, vbo 32 -> l = 32 + 0 = 32 -> col 2 -> 288; 127 -> l = 32 + 31 = 63 -> col 3 -> 19*16 + 15 = 319.
    1: [PAD, PAD, PAD, 160, 175, 176, 191, PAD, 288, 319],
}


@pytest.mark.parametrize("rank", [0, 1])
def test_example_4_dcp_ownership_is_decided_in_allocation_blocks(rank):
    """§10 example 4 (#51031). Risky: with a kernel block (16) smaller than the allocation block
    (32), vLLM used to decide ownership per kernel block, VB = B*W = 32: with I = 32, vbo // 32 = 0
    for every position, so rank 0 owned everything and g0 gave
    [160, 176, 191, 176, 191, 192, 207, 288, 304, 335] -- positions 16 and 32 collide at 176,
    and position 48 lands in kernel block 12, which is not in the row -- while rank 1 got all -1.
    It also localised the replicated group (#56723).

    1. append(0, ([5, 9], [20, ..., 27]), True), apply: rows[0][0] = [10, 11, 18, 19]
       (5 -> 10, 11; 9 -> 18, 19), rows[1][0] = [20, ..., 27].
    2. idx = [0], qsl = [0, 10], positions as EXAMPLE_4_POSITIONS, num_tokens_padded = 10.
    3. g0 (sharded): VB = 64, rank 0 owns vbo in [0, 32), rank 1 [32, 64) (values in
       EXAMPLE_4_G0's comments); g1 (replicated): every position on both ranks.
    4. slots[:, 10:16] = -1.
    """
    bt = example_4(rank)
    bt.append_block_ids(0, ([5, 9], list(range(20, 28))), overwrite=True)
    bt.apply_staged_writes()
    assert_array(bt.rows[0], i32([[10, 11, 18, 19]]))
    assert_array(bt.rows[1], i32([[20, 21, 22, 23, 24, 25, 26, 27]]))
    out = bt.compute_slot_mappings(i32([0]), i32([0, 10]), i64(EXAMPLE_4_POSITIONS), 10)
    assert_array(bt.slots, i64([EXAMPLE_4_G0[rank] + [PAD] * 6, EXAMPLE_4_G1 + [PAD] * 6]))
    assert_array(out, bt.slots[:, :10].copy())
    assert_view(out, bt.slots)


def test_example_4_each_sharded_position_is_local_on_exactly_one_rank():
    """§10 example 4: across the two ranks every g0 position has one slot, and each rank's
    block 5 (kernel blocks 10, 11, slots 160..191) holds its own 32 positions."""
    got = {}
    for rank in (0, 1):
        bt = example_4(rank)
        bt.append_block_ids(0, ([5, 9], list(range(20, 28))), overwrite=True)
        bt.apply_staged_writes()
        got[rank] = bt.compute_slot_mappings(i32([0]), i32([0, 10]), i64(EXAMPLE_4_POSITIONS), 10).copy()
    g0 = np.stack([got[0][0], got[1][0]])
    assert ((g0 >= 0).sum(axis=0) == 1).all()
    # Rank 0's block 5 holds positions 0, 16, 31 at 160, 176, 191; rank 1's holds 32, 47, 48, 63 at 160..191.
    assert sorted(got[0][0][got[0][0] >= 0].tolist()) == [160, 176, 191, 288]
    assert sorted(got[1][0][got[1][0] >= 0].tolist()) == [160, 175, 176, 191, 288, 319]
    assert_array(got[0][1], got[1][1])


def test_example_4_marking_the_small_group_sharded_is_rejected_at_construction():
    """§10 example 4, last line: g1 sharded needs I = 32 to divide K = 16 (I <= K); it does not."""
    with pytest.raises(ValueError, match="group 1 is sharded: cp_interleave 32 must divide its block size 16"):
        example_4(0, sharded=(True, True))


# -- G = 0 ---------------------------------------------------------------------------------------


def test_no_groups_every_call_is_a_noop_with_empty_results():
    """§10.1: G = 0 is allowed. Risky: a device table sized by G builds zero-size tensors and
    launches with an empty grid. Readings: the argument checks still run; a valid idx_mapping
    may be non-empty; the slot mappings are a (0, n) int64 view."""
    bt = V2BlockTables([], 3, 5, [])
    assert bt.num_groups == 0 and bt.rows == [] and bt.inp == [] and bt.widths == []
    assert_array(bt.cnt, np.zeros((0, 3), np.int32))
    assert_array(bt.cnt_dev, np.zeros((0, 3), np.int32))
    assert_array(bt.slots, np.zeros((0, 5), np.int64))
    bt.append_block_ids(2, (), overwrite=True)
    bt.append_block_ids(0, [], overwrite=False)
    assert bt.staged == []
    bt.apply_staged_writes()
    assert bt.gather_block_tables(i32([1, -1, 1]), 3) == ()
    assert bt.get_dummy_block_tables(3) == ()
    out = bt.compute_slot_mappings(i64([0, 2]), i32([0, 2, 4]), i64([0, 1, 2, 3]), 4)
    assert_array(out, np.zeros((0, 4), np.int64))
    assert_array(bt.get_dummy_slot_mappings(5), np.zeros((0, 5), np.int64))
    assert_array(bt.slots, np.zeros((0, 5), np.int64))
    # The checks still run.
    with pytest.raises(ValueError, match="one id list per group \\(0\\), got 1"):
        bt.append_block_ids(0, ([1],), overwrite=True)
    with pytest.raises(ValueError, match="r must be a slot"):
        bt.append_block_ids(3, (), overwrite=True)
    with pytest.raises(ValueError, match="idx_mapping\\[0\\] = 3"):
        bt.gather_block_tables(i32([3]), 1)
    with pytest.raises(ValueError, match="num_tokens_padded 6 exceeds max_num_batched_tokens 5"):
        bt.compute_slot_mappings(i32([]), i32([0]), i64([]), 6)


# -- §10.2 construction ------------------------------------------------------------------------------


def construct(**kw: Any) -> V2BlockTables:
    args: dict[str, Any] = {"block_sizes": [16, 32], "max_num_reqs": 4, "max_num_batched_tokens": 8,
                                "max_num_blocks_per_group": [4, 2]}
    args.update(kw)
    return V2BlockTables(**args)


@pytest.mark.parametrize("kw, error, match", [
    # The lists differ in length.
    ({"max_num_blocks_per_group": [4]}, ValueError, "per-group lists differ in length"),
    ({"kernel_block_sizes": [16]}, ValueError, "per-group lists differ in length"),
    ({"dcp_sharded": [True]}, ValueError, "per-group lists differ in length"),
    ({"slot_mapping_enabled": [True, True, False]}, ValueError, "per-group lists differ in length"),
    # Any K_g, B_g, M_g, Rmax or Tmax < 1.
    ({"block_sizes": [16, 0]}, ValueError, "block_sizes must be >= 1, got 0"),
    ({"kernel_block_sizes": [16, 0]}, ValueError, "kernel_block_sizes must be >= 1, got 0"),
    ({"max_num_blocks_per_group": [4, 0]}, ValueError, "max_num_blocks_per_group must be >= 1, got 0"),
    ({"max_num_reqs": 0}, ValueError, "max_num_reqs must be >= 1, got 0"),
    ({"max_num_batched_tokens": -1}, ValueError, "max_num_batched_tokens must be >= 1, got -1"),
    # K_g % B_g != 0.
    ({"block_sizes": [16, 24], "kernel_block_sizes": [16, 16]}, ValueError,
     "group 1: block size 24 is not a multiple of kernel block size 16"),
    # W < 1, R outside [0, W), I < 1.
    ({"cp_size": 0}, ValueError, "cp_size must be >= 1, got 0"),
    ({"cp_size": 2, "cp_rank": 2}, ValueError, "cp_rank 2 is out of range \\[0, 2\\)"),
    ({"cp_rank": -1}, ValueError, "cp_rank -1 is out of range \\[0, 1\\)"),
    ({"cp_interleave": 0}, ValueError, "cp_interleave must be >= 1, got 0"),
    # W > 1 and a sharded group with I > K_g or K_g % I != 0.
    ({"cp_size": 2, "cp_interleave": 32}, ValueError, "group 0 is sharded: cp_interleave 32 must divide its block size 16"),
    ({"cp_size": 2, "cp_interleave": 3}, ValueError, "group 0 is sharded: cp_interleave 3"),
    # Kinds (a reading: TypeError, as everywhere else in the project).
    ({"block_sizes": 16}, TypeError, "block_sizes must be a list, got int"),
    ({"block_sizes": [16, 32.0]}, TypeError, "block_sizes entries must be ints, got float"),
    ({"max_num_reqs": True}, TypeError, "max_num_reqs must be an int, got bool"),
    ({"cp_size": "2"}, TypeError, "cp_size must be an int, got str"),
    ({"dcp_sharded": [1, 0]}, TypeError, "dcp_sharded entries must be bools, got int"),
    # Every kind check runs before any value check.
    ({"max_num_reqs": 0, "cp_size": 2.0}, TypeError, "cp_size must be an int"),
])
def test_construction_errors(kw, error, match):
    with pytest.raises(error, match=match):
        construct(**kw)


def test_construction_defaults_and_what_is_not_checked():
    """§10.2: defaults B_g = K_g, every group sharded and enabled. The interleave is checked
    against K_g only for sharded groups and only when W > 1."""
    bt = construct()
    assert bt.kernel_block_sizes == [16, 32] and bt.widths == [4, 2]
    assert bt.sharded == [True, True] and bt.enabled == [True, True]
    assert (bt.cp_size, bt.cp_rank, bt.cp_interleave) == (1, 0, 1)
    assert construct(cp_interleave=64).cp_interleave == 64  # W = 1: any I >= 1
    bt = construct(cp_size=4, cp_rank=3, cp_interleave=32, dcp_sharded=[False, True])  # g0 replicated
    assert bt.widths == [4, 2] and bt.sharded == [False, True]
    bt = tables()
    assert bt.widths == [4, 4] and bt.block_sizes == [16, 32] and bt.kernel_block_sizes == [16, 16]
    assert (bt.max_num_reqs, bt.max_num_batched_tokens, bt.num_groups) == (4, 8, 2)
    for g in range(2):
        assert_array(bt.rows[g], ZERO_ROWS)
        assert_array(bt.inp[g], ZERO_ROWS)
    assert_array(bt.cnt, i32([[0] * 4] * 2))
    assert_array(bt.cnt_dev, i32([[0] * 4] * 2))
    assert_array(bt.slots, ZERO_SLOTS)
    assert bt.staged == []


# -- rejected calls change nothing -------------------------------------------------------------------


def busy() -> V2BlockTables:
    """After 1(c), with inp and slots written (examples 2(a) and 3) and one append staged
    but not applied, so that cnt != cnt_dev and staged is not empty."""
    bt = after_1c()
    bt.gather_block_tables(i32([2, 0]), 3)
    slot_mappings(bt, **EXAMPLE_3)
    bt.append_block_ids(1, ([3], [2]), overwrite=True)
    return bt


GOOD_QSL, GOOD_POS = i32([0, 3, 5]), i64([15, 16, 40, 5, 70])
BAD_CALLS = [
    # §10.3: every rejection is a ValueError, kinds included.
    ("append", lambda bt: bt.append_block_ids(4, ([1], [1]), True), ValueError, "r must be a slot in \\[0, 4\\)"),
    ("append", lambda bt: bt.append_block_ids(-1, ([1], [1]), True), ValueError, "got int -1"),
    ("append", lambda bt: bt.append_block_ids(1.0, ([1], [1]), True), ValueError, "got float"),
    ("append", lambda bt: bt.append_block_ids(True, ([1], [1]), True), ValueError, "got bool"),
    ("append", lambda bt: bt.append_block_ids(1, ([1],), True), ValueError, "one id list per group \\(2\\), got 1"),
    ("append", lambda bt: bt.append_block_ids(1, None, True), ValueError, "must be a sequence of 2 id lists"),
    ("append", lambda bt: bt.append_block_ids(1, ([1], 2), True), ValueError, "new_block_ids\\[1\\] must be a sequence"),
    ("append", lambda bt: bt.append_block_ids(1, ([1], "2"), True), ValueError, "new_block_ids\\[1\\] must be a sequence"),
    ("append", lambda bt: bt.append_block_ids(1, ([-1], []), True), ValueError, "group 0: block id -1 does not fit"),
    ("append", lambda bt: bt.append_block_ids(1, ([True], []), True), ValueError, "must be an int, got bool"),
    ("append", lambda bt: bt.append_block_ids(1, ([], [np.bool_(True)]), True), ValueError, "must be an int, got bool"),
    ("append", lambda bt: bt.append_block_ids(1, ([1.0], []), True), ValueError, "must be an int, got float"),
    # P = 1: 2**31 > 2**31 - 1. P = 2: 2**30 -> 2**31, 2**31 + 1.
    ("append", lambda bt: bt.append_block_ids(1, ([2**31], []), True), ValueError, "group 0: block id 2147483648"),
    ("append", lambda bt: bt.append_block_ids(1, ([], [2**30]), True), ValueError, "group 1: block id 1073741824"),
    # Only g1 overflows (cnt[1, 2] = 4 = width): g0's part must not be staged either.
    ("append", lambda bt: bt.append_block_ids(2, ([1], [1]), False), ValueError, "group 1, slot 2: 2 kernel ids from column 4"),
    ("append", lambda bt: bt.append_block_ids(3, ([1, 2, 3, 4, 5], []), True), ValueError, "end at 5, past width 4"),
    ("append", lambda bt: bt.append_block_ids(1, ([1], [1]), 1), ValueError, "overwrite must be a bool, got int"),
    ("append", lambda bt: bt.append_block_ids(1, ([1], [1]), None), ValueError, "overwrite must be a bool"),
    # §10.5.
    ("gather", lambda bt: bt.gather_block_tables([2, 0], 3), TypeError, "idx_mapping must be a numpy array, got list"),
    ("gather", lambda bt: bt.gather_block_tables(np.array([2, 0], np.int16), 3), TypeError, "must be int32 or int64, got int16"),
    ("gather", lambda bt: bt.gather_block_tables(np.array([2.0, 0.0]), 3), TypeError, "got float64"),
    ("gather", lambda bt: bt.gather_block_tables(i32([[2, 0]]), 3), TypeError, "must be 1-D, got shape \\(1, 2\\)"),
    ("gather", lambda bt: bt.gather_block_tables(i32([2, 0]), 3.0), TypeError, "num_reqs_padded must be an int"),
    ("gather", lambda bt: bt.gather_block_tables(i32([0]), True), TypeError, "num_reqs_padded must be an int, got bool"),
    ("gather", lambda bt: bt.gather_block_tables(i32([2, 0]), 1), ValueError, "2 requests, more than num_reqs_padded 1"),
    ("gather", lambda bt: bt.gather_block_tables(i32([]), -1), ValueError, "more than num_reqs_padded -1"),
    ("gather", lambda bt: bt.gather_block_tables(i32([2, 0]), 5), ValueError, "num_reqs_padded 5 exceeds max_num_reqs 4"),
    ("gather", lambda bt: bt.gather_block_tables(i32([2, 4]), 3), ValueError, "idx_mapping\\[1\\] = 4 is neither"),
    ("gather", lambda bt: bt.gather_block_tables(i64([-2, 0]), 3), ValueError, "idx_mapping\\[0\\] = -2 is neither"),
    # Several faults: the TypeError wins.
    ("gather", lambda bt: bt.gather_block_tables(i32([9]), 2.5), TypeError, "num_reqs_padded must be an int"),
    # §10.6.
    ("dummy tables", lambda bt: bt.get_dummy_block_tables(5), ValueError, "n 5 is out of range \\[0, 4\\]"),
    ("dummy tables", lambda bt: bt.get_dummy_block_tables(-1), ValueError, "n -1 is out of range"),
    ("dummy tables", lambda bt: bt.get_dummy_block_tables(1.5), TypeError, "n must be an int, got float"),
    # §10.7.
    ("slots", lambda bt: bt.compute_slot_mappings([2, 0], GOOD_QSL, GOOD_POS, 6), TypeError, "idx_mapping must be a numpy array"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 5]), GOOD_QSL, GOOD_POS, 6), ValueError, "idx_mapping\\[1\\] = 5"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([0] * 5), i32([0] * 6), GOOD_POS, 6), ValueError,
     "5 requests, more than max_num_reqs 4"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), i64([0, 3, 5]), GOOD_POS, 6), TypeError,
     "query_start_loc must be int32, got int64"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), i32([[0, 3, 5]]), GOOD_POS, 6), TypeError,
     "query_start_loc must be 1-D"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), [0, 3, 5], GOOD_POS, 6), TypeError,
     "query_start_loc must be a numpy array"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), i32([0, 3]), GOOD_POS, 6), ValueError,
     "query_start_loc must hold at least N\\+1 = 3 entries, got 2"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), i32([1, 3, 5]), GOOD_POS, 6), ValueError,
     "query_start_loc\\[0\\] must be 0, got 1"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), i32([0, 3, 2]), GOOD_POS, 6), ValueError,
     "query_start_loc decreases at request 1: 3 -> 2"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), GOOD_QSL, GOOD_POS, 4), ValueError,
     "5 scheduled tokens exceed num_tokens_padded 4"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), GOOD_QSL, GOOD_POS, 9), ValueError,
     "num_tokens_padded 9 exceeds max_num_batched_tokens 8"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), GOOD_QSL, GOOD_POS, np.float64(6)), TypeError,
     "num_tokens_padded must be an int"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), GOOD_QSL, i32([15, 16, 40, 5, 70]), 6), TypeError,
     "positions must be int64, got int32"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), GOOD_QSL, i64([15, 16, 40, 5]), 6), ValueError,
     "positions holds 4 entries, fewer than the 5 scheduled tokens"),
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), GOOD_QSL, i64([15, 16, 40, -5, 70]), 6), ValueError,
     "position -5 of token 3 is negative"),
    # Several faults: the TypeError wins.
    ("slots", lambda bt: bt.compute_slot_mappings(i32([2, 0]), i32([1, 3, 5]), i32([1]), 6), TypeError,
     "positions must be int64"),
    # §10.8.
    ("dummy slots", lambda bt: bt.get_dummy_slot_mappings(9), ValueError, "n 9 is out of range \\[0, 8\\]"),
    ("dummy slots", lambda bt: bt.get_dummy_slot_mappings(-1), ValueError, "n -1 is out of range"),
    ("dummy slots", lambda bt: bt.get_dummy_slot_mappings(None), TypeError, "n must be an int, got NoneType"),
]


@pytest.mark.parametrize("call, error, match", [c[1:] for c in BAD_CALLS],
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_a_rejected_call_leaves_every_array_and_staged_bit_identical(call, error, match):
    """§10.9: after a rejected call rows, inp, cnt, cnt_dev, slots and staged are bit-identical
    to before (a deep copy of the whole object is compared). Risky: vLLM raises for the width
    only after staging earlier groups, and checks nothing else."""
    bt = busy()
    before = snapshot(bt)
    with pytest.raises(error, match=match):
        call(bt)
    assert same(snapshot(bt), before)
    # The pending append is still there and lands as it would have.
    bt.apply_staged_writes()
    assert_array(bt.rows[0][1], i32([3, 0, 0, 0]))
    assert_array(bt.rows[1][1], i32([4, 5, 0, 0]))


# -- §10.3 and §10.4: staging -----------------------------------------------------------------------


def test_a_second_append_before_apply_starts_at_the_updated_host_count():
    """§10.3. Risky: an implementation that takes the start from cnt_dev (the last apply), or
    from the rows, writes the second append over the first.

    1. append(1, ([1], [1]), True): (0, 1, 0, [1]), (1, 1, 0, [2, 3]); cnt[:, 1] = [1, 2].
    2. append(1, ([2, 3], [2]), False): g0 starts at 1 -> (0, 1, 1, [2, 3]), end 3;
       g1 starts at 2, block 2 -> [4, 5] -> (1, 1, 2, [4, 5]), end 4.
    3. apply: rows[0][1] = [1, 2, 3, 0], rows[1][1] = [2, 3, 4, 5]; cnt_dev[:, 1] = [3, 4].
    """
    bt = tables()
    bt.append_block_ids(1, ([1], [1]), overwrite=True)
    bt.append_block_ids(1, ([2, 3], [2]), overwrite=False)
    assert bt.staged == [(0, 1, 0, [1]), (1, 1, 0, [2, 3]), (0, 1, 1, [2, 3]), (1, 1, 2, [4, 5])]
    assert_array(bt.cnt, i32([[0, 3, 0, 0], [0, 4, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[0, 0, 0, 0], [0, 0, 0, 0]]))
    bt.apply_staged_writes()
    assert_array(bt.rows[0], i32([[0, 0, 0, 0], [1, 2, 3, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.rows[1], i32([[0, 0, 0, 0], [2, 3, 4, 5], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[0, 3, 0, 0], [0, 4, 0, 0]]))


def test_an_empty_append_without_overwrite_changes_nothing():
    bt = after_1c()
    before = snapshot(bt)
    bt.append_block_ids(2, ([], []), overwrite=False)
    bt.append_block_ids(1, (np.array([], np.int64), range(0)), overwrite=False)
    assert same(snapshot(bt), before)


def test_ids_may_be_numpy_integers_and_arrays_and_the_largest_ids_fit():
    """§10.3: the last kernel id may be 2**31 - 1: P = 1 takes 2**31 - 1; P = 2 takes
    2**30 - 1 -> 2**31 - 2, 2**31 - 1."""
    bt = tables()
    bt.append_block_ids(np.int64(3), (np.array([2**31 - 1], np.int64), [np.int32(2**30 - 1)]), overwrite=np.bool_(True))
    assert bt.staged == [(0, 3, 0, [2147483647]), (1, 3, 0, [2147483646, 2147483647])]
    assert all(type(x) is int for _, _, _, ids in bt.staged for x in ids)
    bt.apply_staged_writes()
    assert_array(bt.rows[0][3], i32([2147483647, 0, 0, 0]))
    assert_array(bt.rows[1][3], i32([2147483646, 2147483647, 0, 0]))
    # The slots of the largest ids do not wrap, positions 15 and 31 (2**31 * 16 = 34359738368):
    # g0: 15 -> col 0 -> (2**31 - 1)*16 + 15 = 34359738367; 31 -> col 1 -> 0*16 + 15 = 15.
    # g1: 15 -> col 0 -> (2**31 - 2)*16 + 15 = 34359738351; 31 -> col 1 -> (2**31 - 1)*16 + 15 = 34359738367.
    bt.compute_slot_mappings(i32([3]), i32([0, 2]), i64([15, 31]), 2)
    assert_array(bt.slots, i64([[34359738367, 15] + [PAD] * 6, [34359738351, 34359738367] + [PAD] * 6]))


def test_apply_empties_staged_and_snapshots_cnt_dev():
    """§10.4. Risky: cnt_dev must be a copy taken at apply, not an alias of cnt; and apply with
    nothing staged still snapshots (an overwrite with no ids stages nothing but moves cnt).

    1. After 1(c): cnt = cnt_dev = [1 0 3 0; 2 0 4 0], staged empty.
    2. append(3, ([1], [1]), True): cnt[:, 3] = [1, 2]; cnt_dev unchanged.
    3. apply; then append(3, ([2], [2]), False): cnt[:, 3] = [2, 4], cnt_dev[:, 3] stays [1, 2].
    4. apply; then append(3, ([], []), True) stages nothing, cnt[:, 3] = [0, 0]; apply:
       cnt_dev[:, 3] = [0, 0], rows unchanged (stale): rows[0][3] = [1, 2, 0, 0],
       rows[1][3] = [2, 3, 4, 5].
    """
    bt = after_1c()
    assert bt.staged == []
    bt.append_block_ids(3, ([1], [1]), overwrite=True)
    assert_array(bt.cnt_dev, i32([[1, 0, 3, 0], [2, 0, 4, 0]]))
    bt.apply_staged_writes()
    assert bt.staged == []
    bt.append_block_ids(3, ([2], [2]), overwrite=False)
    assert_array(bt.cnt, i32([[1, 0, 3, 2], [2, 0, 4, 4]]))
    assert_array(bt.cnt_dev, i32([[1, 0, 3, 1], [2, 0, 4, 2]]))
    bt.apply_staged_writes()
    bt.append_block_ids(3, ([], []), overwrite=True)
    assert bt.staged == []
    bt.apply_staged_writes()
    assert_array(bt.cnt_dev, i32([[1, 0, 3, 0], [2, 0, 4, 0]]))
    assert_array(bt.rows[0][3], i32([1, 2, 0, 0]))
    assert_array(bt.rows[1][3], i32([2, 3, 4, 5]))
    assert not np.shares_memory(bt.cnt, bt.cnt_dev)


def test_overlapping_staged_writes_land_in_staging_order():
    """§10.4, a reading: where two staged writes overlap, the later one wins (vLLM's concurrent
    programs would race; its runner never stages two writes to one row in a step).

    1. append(1, ([1, 2], []), True) stages (0, 1, 0, [1, 2]); append(1, ([3], []), True)
       stages (0, 1, 0, [3]) and sets cnt[0, 1] = 1.
    2. apply: column 0 gets 1, then 3; column 1 keeps 2: rows[0][1] = [3, 2, 0, 0].
    """
    bt = tables()
    bt.append_block_ids(1, ([1, 2], []), overwrite=True)
    bt.append_block_ids(1, ([3], []), overwrite=True)
    assert bt.staged == [(0, 1, 0, [1, 2]), (0, 1, 0, [3])]
    bt.apply_staged_writes()
    assert_array(bt.rows[0], i32([[0, 0, 0, 0], [3, 2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.cnt_dev, i32([[0, 1, 0, 0], [0, 0, 0, 0]]))


# -- §10.5-§10.8: what the step calls read and write ----------------------------------------------------


def test_gather_and_slot_mapping_read_rows_and_cnt_dev_as_of_the_last_apply():
    """§10.5, §10.7. Risky: a device table that applies on append, or a gather that reads the
    host count, shows ids the kernels must not see yet.

    1. After 1(c), stage append(0, ([1], [1]), False): g0 (0, 0, 1, [1]), g1 (1, 0, 2, [2, 3]);
       cnt[:, 0] = [2, 4] but cnt_dev[:, 0] = [1, 2] and rows[.][0] as before.
    2. gather([0], 1): g0 copies cnt_dev = 1 entry -> [9, 0, 0, 0]; g1 2 -> [8, 9, 0, 0].
    3. slots for r0 at positions 16, 40: g0 16 -> col 1 -> rows 0 -> 0*16 + 0 = 0;
       40 -> col 2 -> 0*16 + 8 = 8. g1 16 -> col 1 -> 9*16 = 144; 40 -> col 2 -> 0 + 8 = 8.
    4. apply, then again: gather g0 [9, 1, 0, 0], g1 [8, 9, 2, 3]; slots g0 16 -> 1*16 = 16,
       40 -> 8 (col 2 still 0); g1 16 -> 144, 40 -> 2*16 + 8 = 40.
    """
    bt = after_1c()
    bt.append_block_ids(0, ([1], [1]), overwrite=False)
    bt.gather_block_tables(i32([0]), 1)
    assert_array(bt.inp[0][0], i32([9, 0, 0, 0]))
    assert_array(bt.inp[1][0], i32([8, 9, 0, 0]))
    bt.compute_slot_mappings(i32([0]), i32([0, 2]), i64([16, 40]), 2)
    assert_array(bt.slots, i64([[0, 8, PAD, PAD, PAD, PAD, PAD, PAD], [144, 8, PAD, PAD, PAD, PAD, PAD, PAD]]))
    bt.apply_staged_writes()
    bt.gather_block_tables(i32([0]), 1)
    assert_array(bt.inp[0][0], i32([9, 1, 0, 0]))
    assert_array(bt.inp[1][0], i32([8, 9, 2, 3]))
    bt.compute_slot_mappings(i32([0]), i32([0, 2]), i64([16, 40]), 2)
    assert_array(bt.slots, i64([[16, 8, PAD, PAD, PAD, PAD, PAD, PAD], [144, 40, PAD, PAD, PAD, PAD, PAD, PAD]]))


def test_slot_mapping_reads_entries_past_the_count():
    """§10.7, notes: the kernel does not consult cnt, so a column in [cnt, width) gives what it
    holds. After 1(e), g1's r2 has count 0 but entries [6, 7, 2, 3]: position 0 -> 6*16 = 96,
    position 40 -> col 2 -> 2*16 + 8 = 40. g0's r2 [11, 6, 7, 0], count 1: 0 -> 11*16 = 176,
    40 -> col 2 (stale 7) -> 7*16 + 8 = 120."""
    bt = after_1c()
    step_1e(bt)
    bt.compute_slot_mappings(i32([2]), i32([0, 2]), i64([0, 40]), 2)
    assert_array(bt.slots, i64([[176, 120] + [PAD] * 6, [96, 40] + [PAD] * 6]))


def test_duplicate_idx_entries_are_allowed():
    """§10.5: two batch positions may name one slot (each gets its own copy of the row).

    1. After 1(c), gather([2, 2, 0], 3): b0 and b1 <- r2, b2 <- r0.
       g0: [5, 6, 7, 0], [5, 6, 7, 0], [9, 0, 0, 0]; g1: [6, 7, 2, 3] twice, [8, 9, 0, 0].
    2. slots with idx [0, 0], qsl [0, 1, 2], positions [5, 16]:
       g0 5 -> 9*16 + 5 = 149; 16 -> col 1 -> 0*16 = 0. g1 5 -> 8*16 + 5 = 133; 16 -> 9*16 = 144.
    """
    bt = after_1c()
    bt.gather_block_tables(i32([2, 2, 0]), 3)
    assert_array(bt.inp[0], i32([[5, 6, 7, 0], [5, 6, 7, 0], [9, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.inp[1], i32([[6, 7, 2, 3], [6, 7, 2, 3], [8, 9, 0, 0], [0, 0, 0, 0]]))
    bt.compute_slot_mappings(i64([0, 0]), i32([0, 1, 2]), i64([5, 16]), 2)
    assert_array(bt.slots, i64([[149, 0] + [PAD] * 6, [133, 144] + [PAD] * 6]))


def test_gather_leaves_rows_past_num_reqs_padded_untouched():
    """§10.5: rows >= num_reqs_padded are unchanged. After 2(a) (inp rows 0, 1 filled),
    gather([], 1) zeroes row 0 only (padding) and keeps row 1 as 2(a) left it."""
    bt = after_1c()
    bt.gather_block_tables(i32([2, 0]), 3)
    out = bt.gather_block_tables(i32([]), 1)
    assert_array(bt.inp[0], i32([[0, 0, 0, 0], [9, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.inp[1], i32([[0, 0, 0, 0], [8, 9, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert [o.shape for o in out] == [(1, 4), (1, 4)]


def test_dummy_block_tables_zero_the_first_n_rows_in_place():
    """§10.6 (#49757: before it vLLM returned the previous step's rows). After 2(a),
    get_dummy_block_tables(1) zeroes row 0 of each group and keeps row 1 ([9, 0, 0, 0] and
    [8, 9, 0, 0]); the result is the persistent storage, also for n = 0."""
    bt = after_1c()
    bt.gather_block_tables(i32([2, 0]), 3)
    out = bt.get_dummy_block_tables(1)
    assert_array(bt.inp[0], i32([[0, 0, 0, 0], [9, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.inp[1], i32([[0, 0, 0, 0], [8, 9, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    for g in range(2):
        assert_array(out[g], i32([[0, 0, 0, 0]]))
        assert_view(out[g], bt.inp[g])
    empty = bt.get_dummy_block_tables(0)
    for g in range(2):
        assert empty[g].shape == (0, 4)
        assert_view(empty[g], bt.inp[g])
    assert_array(bt.inp[0][1], i32([9, 0, 0, 0]))


def test_dummy_slot_mappings_pad_the_whole_buffer():
    """§10.8: every group, all Tmax columns become -1, whatever n; the result is slots[:, :n]."""
    bt = after_1c()
    slot_mappings(bt, **EXAMPLE_3)
    out = bt.get_dummy_slot_mappings(2)
    assert_array(bt.slots, i64([[PAD] * 8, [PAD] * 8]))
    assert_array(out, i64([[PAD, PAD], [PAD, PAD]]))
    assert_view(out, bt.slots)
    assert bt.get_dummy_slot_mappings(0).shape == (2, 0)
    assert_view(bt.get_dummy_slot_mappings(8), bt.slots)


def test_slot_mapping_reads_only_qsl_up_to_n_and_positions_up_to_t():
    """§10.7: qsl entries past N and positions past T are neither read nor checked. Example 3
    with qsl = [0, 3, 5, 1, -7] and positions [15, 16, 40, 5, 70, -1, -9] gives example 3's slots."""
    bt = after_1c()
    bt.compute_slot_mappings(i32([2, 0]), i32([0, 3, 5, 1, -7]), i64([15, 16, 40, 5, 70, -1, -9]), 6)
    assert_array(bt.slots, i64([[95, 96, 120, 149, PAD, PAD, PAD, PAD],
                                [111, 112, 40, 133, PAD, PAD, PAD, PAD]]))


def test_slot_mapping_with_no_tokens_pads_everything_it_owns():
    """§10.7 with N = 0 (qsl = [0], T = 0): slots[g, 0:Tmax] = -1 for every group. With
    requests of no tokens (qsl = [0, 0, 0]) the same."""
    for idx, qsl in ((i32([]), i32([0])), (i32([2, 0]), i32([0, 0, 0]))):
        bt = after_1c()
        out = bt.compute_slot_mappings(idx, qsl, i64([]), 0)
        assert_array(bt.slots, i64([[PAD] * 8, [PAD] * 8]))
        assert out.shape == (2, 0)


def test_a_position_far_past_the_row_maps_to_pad():
    """§10.7's guard with a position near 2**63: col = p // 16 >= width -> -1, no overflow."""
    bt = after_1c()
    bt.compute_slot_mappings(i32([2]), i32([0, 2]), i64([2**63 - 1, 63]), 2)
    # 63 -> col 3: g0 rows[0][2, 3] = 0 -> 0*16 + 15 = 15; g1 rows[1][2, 3] = 3 -> 3*16 + 15 = 63.
    assert_array(bt.slots, i64([[PAD, 15] + [PAD] * 6, [PAD, 63] + [PAD] * 6]))


def test_a_dummy_zeroes_what_the_row_held_before():
    """§10.5, a reading: a dummy (-1) gets a zero row over its whole width, also where the row
    held ids (in 2(b) its row was already zero). vLLM reads slot -1 out of bounds instead.

    1. After 2(a): inp[0] rows 0, 1 = [5, 6, 7, 0], [9, 0, 0, 0]; inp[1] [6, 7, 2, 3], [8, 9, 0, 0].
    2. gather([-1, 2], 2): b0 (dummy) -> zeros; b1 <- r2: g0 n = 3 -> [5, 6, 7] and col 3
       keeps 0; g1 n = 4 -> [6, 7, 2, 3].
    """
    bt = after_1c()
    bt.gather_block_tables(i32([2, 0]), 3)
    bt.gather_block_tables(i32([-1, 2]), 2)
    assert_array(bt.inp[0], i32([[0, 0, 0, 0], [5, 6, 7, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert_array(bt.inp[1], i32([[0, 0, 0, 0], [6, 7, 2, 3], [0, 0, 0, 0], [0, 0, 0, 0]]))


def test_staged_ids_are_a_copy_of_the_callers_lists():
    """Reading: `staged` holds new lists of Python ints, so changing the caller's list or
    array after the append changes nothing. append(1, (ids0, ids1), True) with ids0 = [4],
    ids1 = array([2]) stages (0, 1, 0, [4]) and (1, 1, 0, [4, 5]); the caller then writes 7
    into both; apply still lands rows[0][1] = [4, 0, 0, 0] and rows[1][1] = [4, 5, 0, 0]."""
    bt = tables()
    ids0, ids1 = [4], np.array([2], np.int64)
    bt.append_block_ids(1, (ids0, ids1), overwrite=True)
    ids0[0] = 7
    ids1[0] = 7
    assert bt.staged == [(0, 1, 0, [4]), (1, 1, 0, [4, 5])]
    bt.apply_staged_writes()
    assert_array(bt.rows[0][1], i32([4, 0, 0, 0]))
    assert_array(bt.rows[1][1], i32([4, 5, 0, 0]))


def test_a_dummys_positions_are_still_checked(rejects):
    """Reading: §10.7's position check covers every t < T, a dummy's tokens included."""
    bt = busy()
    rejects(bt, ValueError, "position -1 of token 1 is negative",
            bt.compute_slot_mappings, i32([2, -1]), i32([0, 1, 2]), i64([3, -1]), 2)
