"""docs/contract.md §7: the per-sequence history the data-level oracle reads back against."""

import pytest

from blocktable.reference import History


def test_write_fork_and_recompute():
    h = History()
    h.add(1)
    h.write(1, 0, [10, 11, 12])
    h.fork(1, 2)
    h.write(2, 3, [20])
    h.write(1, 3, [13])
    assert h[1] == [10, 11, 12, 13] and h[2] == [10, 11, 12, 20]
    h.write(1, 0, [10, 11, 12, 13])  # a recompute rewrites the same positions
    assert h[1] == [10, 11, 12, 13]
    h.drop(2)
    assert 2 not in h.values


def test_a_write_may_not_leave_a_hole(rejects):
    h = History()
    h.add(1)
    h.write(1, 0, [1])
    rejects(h, ValueError, "write at 3 would leave a hole after 1 values", h.write, 1, 3, [5])
    rejects(h, ValueError, "sequence 1 already exists", h.add, 1)
    with pytest.raises(KeyError):
        h.write(7, 0, [1])
