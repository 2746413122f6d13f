"""Our multi-group table through docs/contract.md §11's V1 table protocol
(blocktable/classes/table.py), and the example class (examples/table_class.py),
are the reference table, call for call: row operations on every group at once,
the commit, and each rank's whole slot buffers (the -1 tail included) from the
committed rows. A refused call raises ValueError and changes no accessor's value."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from blocktable.classes.table import Table
from blocktable.reference import GroupLayout, slot_mapping
from blocktable.reference import MultiGroupBlockTable as ReferenceGroups

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "table_class.py"
W, ROWS, MODEL_LEN, TMAX = 2, 3, 40, 16
GROUPS = [dict(K=4, B=2, sharded=True, I=2), dict(K=2, B=2, sharded=False, I=1)]


def example():
    spec = importlib.util.spec_from_file_location("table_class_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NumpyTable


CLASSES = {"ours": lambda: Table, "example": example}


def build(cls, backend, rank):
    return cls(max_num_reqs=ROWS, max_model_len=MODEL_LEN, max_num_batched_tokens=TMAX, device=backend.device,
               block_sizes=[g["K"] for g in GROUPS], kernel_block_sizes=[g["B"] for g in GROUPS],
               sharded=[g["sharded"] for g in GROUPS], cp_world_size=W, cp_rank=rank,
               cp_interleave=[g["I"] for g in GROUPS])


def reference():
    layouts = [GroupLayout(g["K"], g["B"], g["sharded"], W if g["sharded"] else 1, g["I"]) for g in GROUPS]
    return ReferenceGroups(ROWS, MODEL_LEN, layouts), layouts


def state(table):
    return [(table.host_rows(g).copy(), np.asarray(table.counts(g)).copy(), table.device_rows(g).cpu().numpy())
            for g in range(len(GROUPS))]


def assert_same(table, ref):
    for g, (host, counts, device) in enumerate(state(table)):
        assert host.dtype == np.int32 and np.array_equal(host, ref[g].host), g
        assert np.array_equal(counts, ref[g].count), g
        assert np.array_equal(device, ref[g].device), g


@pytest.mark.parametrize("which", CLASSES)
def test_a_script_through_the_protocol_is_the_reference(backend, which):
    cls = CLASSES[which]()
    tables = [build(cls, backend, R) for R in range(W)]
    ref, layouts = reference()
    script = [("add_row", ([1, 2], [3]), 0), ("append_row", ([5], [6, 7]), 0), ("add_row", ([8], [9]), 1),
              ("swap_row", 0, 1), ("move_row", 1, 2), ("move_row", 2, 2), ("swap_row", 0, 0),
              ("add_row", ([11], []), 1), ("commit", 3), ("clear_row", 1), ("append_row", ([], [12]), 0)]
    for name, *args in script:
        getattr(ref, name)(*args)
        for table in tables:
            getattr(table, "commit_block_table" if name == "commit" else name)(*args)
            assert_same(table, ref)
    for table in tables:
        table.commit_block_table(2)
    ref.commit(2)
    qsl = np.array([0, 5, 9], dtype=np.int32)
    positions = np.array([0, 1, 2, 3, 7, 3, 4, 5, 30], dtype=np.int64)  # 30: past row 1's blocks
    for R, table in enumerate(tables):
        table.compute_slot_mapping(2, torch.from_numpy(qsl).to(backend.device),
                                   torch.from_numpy(positions).to(backend.device))
        for g, lay in enumerate(layouts):
            rank = R if lay.cp_world_size > 1 else 0
            expected = slot_mapping(qsl, positions, ref[g].device, TMAX, kv_block_size=lay.kv_block_size,
                                    kernel_block_size=lay.kernel_block_size, cp_world_size=lay.cp_world_size,
                                    cp_rank=rank, cp_interleave=lay.cp_interleave)
            got = table.slot_mapping(g)
            assert got.dtype == torch.int64 and got.shape == (TMAX,)
            assert np.array_equal(got.cpu().numpy(), expected), (R, g)
    for table in tables:
        table.clear()
    ref.clear()
    for table in tables:
        assert_same(table, ref)


@pytest.mark.parametrize("which", CLASSES)
def test_a_refused_call_raises_and_changes_nothing(backend, which):
    table = build(CLASSES[which](), backend, 0)
    table.add_row(([1], [2]), 0)
    table.commit_block_table(1)
    width = table.host_rows(0).shape[1]
    too_many = list(range(width // 2 + 1))  # each block is P = 2 kernel blocks in group 0
    for name, args in [("append_row", ((too_many, []), 0)), ("append_row", (([], [1] * 1000), 0)),
                       ("add_row", ((too_many, [3]), 1)), ("add_row", (([1], [2]), ROWS)),
                       ("append_row", (([1],), 0)), ("move_row", (0, ROWS)), ("swap_row", (ROWS, 0)),
                       ("clear_row", (-1,)), ("commit_block_table", (ROWS + 1,))]:
        before = state(table)
        with pytest.raises(ValueError):
            getattr(table, name)(*args)
        after = state(table)
        assert all(np.array_equal(a, b) for was, now in zip(before, after) for a, b in zip(was, now)), name
