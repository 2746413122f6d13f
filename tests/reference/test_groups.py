"""docs/contract.md §3: multi-group tables broadcast row operations; one group's failure changes no group."""

import pytest

from blocktable.reference import GroupLayout, MultiGroupBlockTable


def tables():
    # Group 0: K=B=16 (width 8 at 128 tokens). Group 1: K=32, B=16 (P=2, width 8*... ).
    return MultiGroupBlockTable(3, 128, [GroupLayout(16, 16), GroupLayout(32, 16),
                                         GroupLayout(16, 16, sharded=False)])


def test_row_operations_broadcast_to_every_group():
    m = tables()
    m.append_row([[1, 2], [3], [4]], 0)
    assert m[0].row(0) == [1, 2] and m[1].row(0) == [6, 7] and m[2].row(0) == [4]
    m.move_row(0, 2)
    assert all(t.count[0] == 0 for t in m.tables)
    assert m[1].row(2) == [6, 7]
    m.swap_row(2, 1)
    assert m[0].row(1) == [1, 2] and m[0].count[2] == 0
    m.commit(3)
    assert list(m[1].device[1][:2]) == [6, 7]
    m.clear_row(1)
    assert all(t.count[1] == 0 for t in m.tables)
    m.add_row([[5], [], [6]], 1)
    assert m[0].row(1) == [5] and m[1].row(1) == [] and m[2].row(1) == [6]
    m.clear()
    assert not any(t.host.any() or t.device.any() for t in m.tables)


def test_overflow_in_one_group_changes_no_group(rejects):
    m = tables()
    width1 = m[1].width  # kernel entries; each allocation id takes 2
    m.append_row([[1], [1] * (width1 // 2), [1]], 0)
    rejects(tuple(m.tables), ValueError, "row 0 overflows", m.append_row, [[2], [2], [2]], 0)


def test_one_id_list_per_group_is_required(rejects):
    m = tables()
    rejects(tuple(m.tables), ValueError, "expected one id list per group \\(3\\), got 2",
            m.append_row, [[1], [2]], 0)


def test_no_groups_is_rejected():
    with pytest.raises(ValueError, match="at least one group"):
        MultiGroupBlockTable(2, 128, [])
