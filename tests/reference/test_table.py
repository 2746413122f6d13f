"""docs/contract.md §3 and §5: row operations on one group's table, whole buffers included."""

import numpy as np
import pytest

from blocktable.reference import BlockTable, GroupLayout

# K=16 and max_model_len=128 give width 8: small enough to write whole rows by hand.
FLAT = GroupLayout(16, 16)
HYBRID = GroupLayout(32, 16)  # P=2; max_model_len 256 -> cdiv(256, 32)=8 blocks, align 4 -> 8*2 = 16


def table(layout=FLAT, rows=4, max_model_len=128):
    return BlockTable(rows, max_model_len, layout)


def test_append_writes_at_count_and_add_keeps_the_stale_tail():
    t = table()
    t.append_row([5, 6, 7], 1)
    t.append_row([8], 1)
    assert list(t.host[1]) == [5, 6, 7, 8, 0, 0, 0, 0] and t.count[1] == 4
    # add_row: count = 0, then append. Entries past the new count keep what they held.
    t.add_row([9], 1)
    assert list(t.host[1]) == [9, 6, 7, 8, 0, 0, 0, 0] and t.count[1] == 1
    assert t.row(1) == [9]


def test_append_of_nothing_is_a_noop():
    t = table()
    t.append_row([3], 0)
    t.append_row([], 0)
    assert list(t.host[0]) == [3, 0, 0, 0, 0, 0, 0, 0] and t.count[0] == 1


def test_hybrid_append_expands_each_allocation_block():
    t = table(HYBRID, max_model_len=256)
    assert t.width == 16
    t.append_row([5, 9], 0)  # -> [10, 11, 18, 19]
    assert t.row(0) == [10, 11, 18, 19] and t.count[0] == 4


def test_overflow_is_rejected_and_the_row_is_unchanged(rejects):
    """vLLM adds to the count before it notices the overflow; the contract does not."""
    t = table()
    t.append_row([1, 2, 3, 4, 5, 6], 2)
    rejects(t, ValueError, "row 2 overflows: it holds 6 entries, appending 3 kernel blocks .* width 8",
            t.append_row, [7, 8, 9], 2)
    rejects(t, ValueError, "row 2 overflows", t.add_row, list(range(1, 10)), 2)
    t.append_row([7, 8], 2)  # exactly full is fine
    assert t.count[2] == 8


def test_hybrid_overflow_counts_kernel_blocks(rejects):
    t = table(HYBRID, max_model_len=256)
    t.append_row(list(range(1, 8)), 0)  # 14 of 16 kernel entries
    rejects(t, ValueError, "appending 4 kernel blocks \\(2 allocation blocks\\) exceeds width 16",
            t.append_row, [20, 21], 0)


def test_clear_row_zeroes_the_filled_part_only():
    t = table()
    t.append_row([1, 2, 3, 4], 0)
    t.add_row([7], 0)  # tail [2, 3, 4] now stale
    t.clear_row(0)
    assert list(t.host[0]) == [0, 2, 3, 4, 0, 0, 0, 0] and t.count[0] == 0


def test_move_row_copies_the_count_clears_the_source_and_keeps_dst_tail():
    t = table()
    t.append_row([1, 2, 3, 4, 5], 3)  # dst with a longer stale history
    t.add_row([6], 3)
    t.append_row([7, 8], 0)
    t.add_row([9], 0)  # src: [9, 8(stale)], count 1
    t.move_row(0, 3)
    assert list(t.host[3]) == [9, 2, 3, 4, 5, 0, 0, 0] and t.count[3] == 1
    # src: [:count] zeroed, stale entry 8 stays.
    assert list(t.host[0]) == [0, 8, 0, 0, 0, 0, 0, 0] and t.count[0] == 0


def test_move_row_onto_itself_is_a_noop():
    """A naive copy-then-clear would wipe the row."""
    t = table()
    t.append_row([4, 5], 1)
    before = t.host.copy(), t.count.copy()
    t.move_row(1, 1)
    assert np.array_equal(t.host, before[0]) and np.array_equal(t.count, before[1])


def test_swap_row_swaps_whole_rows_and_counts():
    t = table()
    t.append_row([1, 2, 3], 0)
    t.add_row([4], 0)  # [4, 2, 3], count 1
    t.append_row([5, 6], 2)  # [5, 6], count 2
    t.swap_row(0, 2)
    assert list(t.host[0]) == [5, 6, 0, 0, 0, 0, 0, 0] and t.count[0] == 2
    assert list(t.host[2]) == [4, 2, 3, 0, 0, 0, 0, 0] and t.count[2] == 1
    snapshot = t.host.copy(), t.count.copy()
    t.swap_row(2, 2)
    assert np.array_equal(t.host, snapshot[0]) and np.array_equal(t.count, snapshot[1])


def test_commit_is_a_snapshot_of_the_first_n_rows():
    t = table()
    t.append_row([1], 0)
    t.append_row([2], 1)
    t.append_row([3], 2)
    t.commit(2)
    t.append_row([9], 0)  # after the commit: not on the device
    assert list(t.device[0]) == [1, 0, 0, 0, 0, 0, 0, 0]
    assert list(t.device[1]) == [2, 0, 0, 0, 0, 0, 0, 0]
    assert not t.device[2].any()  # row >= n untouched (still zero)
    t.commit(0)
    assert list(t.device[0]) == [1, 0, 0, 0, 0, 0, 0, 0]


def test_commit_leaves_rows_past_n_as_they_were():
    t = table()
    t.append_row([4], 3)
    t.commit(4)
    t.clear_row(3)
    t.commit(3)
    assert list(t.device[3]) == [4, 0, 0, 0, 0, 0, 0, 0]


def test_clear_zeroes_both_copies():
    t = table()
    t.append_row([1, 2], 0)
    t.commit(1)
    t.clear()
    assert not t.host.any() and not t.count.any() and not t.device.any()


def test_cuda_graph_padding_writes_null_rows_in_place():
    """docs/contract.md §5: rows [N:N_pad] of the table attention reads are NULL_BLOCK_ID (0)."""
    t = table()
    for r, b in enumerate([1, 2, 3, 4]):
        t.append_row([b], r)
    t.commit(4)
    padded = t.pad_for_cuda_graph(1, 3)
    assert padded.shape == (3, 8)
    assert list(padded[0]) == [1, 0, 0, 0, 0, 0, 0, 0]
    assert not padded[1:].any()
    assert list(t.device[3]) == [4, 0, 0, 0, 0, 0, 0, 0]  # past N_pad: untouched


@pytest.mark.parametrize("call, error, match", [
    (lambda t: t.append_row([1], 4), ValueError, "row 4 is out of range \\[0, 4\\)"),
    (lambda t: t.append_row([1], -1), ValueError, "row -1 is out of range"),
    (lambda t: t.append_row([1], 1.0), TypeError, "row must be an int, got float"),
    (lambda t: t.append_row([-3], 0), ValueError, "block id -3 does not fit"),
    (lambda t: t.append_row([2**31], 0), ValueError, "block id 2147483648 does not fit"),
    (lambda t: t.append_row(["7"], 0), TypeError, "block id must be an int, got str"),
    (lambda t: t.move_row(0, 9), ValueError, "dst 9 is out of range"),
    (lambda t: t.swap_row(-2, 0), ValueError, "a -2 is out of range"),
    (lambda t: t.commit(5), ValueError, "commit count 5 is out of range \\[0, 4\\]"),
    (lambda t: t.pad_for_cuda_graph(3, 2), ValueError, "num_reqs \\(3\\) <= num_reqs_padded \\(2\\)"),
])
def test_bad_row_calls_are_rejected_and_change_nothing(rejects, call, error, match):
    t = table()
    t.append_row([1, 2], 0)
    t.commit(1)
    rejects(t, error, match, call, t)


def test_hybrid_block_id_limit_is_checked_after_expansion(rejects):
    t = table(HYBRID, max_model_len=256)
    # P=2: the largest allocation id is (2**31-1 - 1) // 2 = 2**30 - 1 -> kernel ids 2**31-2, 2**31-1.
    t.append_row([2**30 - 1], 0)
    assert t.row(0) == [2**31 - 2, 2**31 - 1]
    rejects(t, ValueError, "block id 1073741824 does not fit", t.append_row, [2**30], 0)
