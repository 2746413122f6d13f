"""Multi-group tables: broadcast, one id list per group, and no partial update."""

import pytest

from blocktable.groups import MultiGroupBlockTable
from blocktable.properties.lockstep.check import check_table
from blocktable.reference import GroupLayout
from blocktable.reference import MultiGroupBlockTable as ReferenceGroups
from blocktable.table import BlockTable

LAYOUTS = [(16, 16, True), (32, 16, True), (16, 8, False)]


def both(backend):
    ref = ReferenceGroups(3, 128, [GroupLayout(K, B, sharded=s, cp_world_size=2) for K, B, s in LAYOUTS])
    impl = MultiGroupBlockTable([BlockTable(3, 128, kv_block_size=K, kernel_block_size=B, sharded=s,
                                            cp_world_size=2, backend=backend) for K, B, s in LAYOUTS])
    return ref, impl


def test_broadcast_operations_match_the_reference(backend):
    ref, impl = both(backend)
    script = [("append_row", ([[1, 2], [3], [4]], 0)), ("add_row", ([[5], [], [6, 7]], 2)),
              ("commit", (3,)), ("move_row", (0, 1)), ("swap_row", (1, 2)), ("clear_row", (2,)),
              ("append_row", ([[8], [9], [10]], 2)), ("commit", (2,)), ("clear", ())]
    for op, args in script:
        getattr(ref, op)(*args)
        getattr(impl, op)(*args)
        for g in range(3):
            check_table(g, ref[g], impl[g], note=f"{op} group {g}")


def test_overflow_in_one_group_changes_no_group(backend, rejects):
    _, impl = both(backend)
    full = impl[1].width // 2  # group 1 has P=2
    impl.append_row([[1], [1] * full, [1]], 0)
    rejects(tuple(impl.tables), ValueError, "row 0 overflows", impl.append_row, [[2], [2], [2]], 0)
    rejects(tuple(impl.tables), ValueError, "expected one id list per group \\(3\\), got 1",
            impl.add_row, [[2]], 0)


def test_groups_must_agree_on_rows(backend):
    with pytest.raises(ValueError, match="same max_num_reqs"):
        MultiGroupBlockTable([BlockTable(2, 64, kv_block_size=16, kernel_block_size=16, backend=backend),
                              BlockTable(3, 64, kv_block_size=16, kernel_block_size=16, backend=backend)])
