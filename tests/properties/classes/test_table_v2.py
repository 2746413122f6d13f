"""A V2 table class under the lockstep (properties/classes/table_v2.py): §10's
operations pass through, every part of §10.1's state is read through its accessor and
checked for type, dtype, shape and device, and a wrong answer or an exception that is
not a refusal is the class's finding, named by the method."""

import numpy as np
import pytest
import torch

from blocktable.classes.table_v2 import TableV2
from blocktable.properties.classes.table_v2 import DrivenV2
from blocktable.properties.compare import Discrepancy

CONFIG = dict(block_sizes=[2, 4], max_num_reqs=3, max_num_batched_tokens=8, max_num_blocks_per_group=[4, 2],
              kernel_block_sizes=[2, 2], cp_size=1, cp_rank=0, cp_interleave=1, dcp_sharded=[True, True],
              slot_mapping_enabled=[True, True])
WIDTHS = [4, 4]  # M * K / B per group


def driven(backend, **methods):
    cls = type("Edited", (TableV2,), methods)
    return DrivenV2.build(cls, "Edited", None, CONFIG, WIDTHS, backend.device)


def test_ours_reads_through_every_accessor(backend):
    tables = driven(backend)
    tables.append_block_ids(1, [[3], [5]], False)
    assert tables.cnt.tolist() == [[0, 1, 0], [0, 2, 0]]  # group 1's block is 2 kernel blocks
    tables.apply_staged_writes()
    assert tables.cnt_dev.tolist() == [[0, 1, 0], [0, 2, 0]]
    assert tables.rows[0][1, :1].tolist() == [3] and tables.rows[1][1, :2].tolist() == [10, 11]
    views = tables.gather_block_tables(torch.tensor([1], dtype=torch.int32, device=backend.device), 2)
    assert len(views) == 2 and views[1][0, :2].tolist() == [10, 11]
    assert tables.inp[1].data_ptr() == views[1].data_ptr()
    slots = tables.compute_slot_mappings(torch.tensor([1], dtype=torch.int32, device=backend.device),
                                         torch.tensor([0, 2], dtype=torch.int32, device=backend.device),
                                         torch.tensor([0, 1], dtype=torch.int64, device=backend.device), 2)
    # group 0: block 3 (K = B = 2): slots 6, 7; group 1: kernel block 10 (B = 2): slots 20, 21.
    assert slots.tolist() == [[6, 7], [20, 21]] and tables.slots[:, 2:].eq(-1).all()


@pytest.mark.parametrize("methods, read, said", [
    (dict(host_counts=lambda self: self._tables.cnt.astype(np.int64)), lambda t: t.cnt,
     "Edited.host_counts() returned a numpy int64 array of shape (2, 3)"),
    (dict(device_counts=lambda self: self._tables.cnt_dev[:1]), lambda t: t.cnt_dev,
     "expected a torch.int32 tensor of shape (2, 3)"),
    (dict(persistent_rows=lambda self, g: self._tables.rows[g].long()), lambda t: t.rows, "persistent_rows(0)"),
    (dict(input_table=lambda self, g: self._tables.inp[g][:, :1]), lambda t: t.inp, "input_table(0)"),
    (dict(slot_mappings=lambda self: None), lambda t: t.slots, "slot_mappings() returned NoneType None"),
    (dict(apply_staged_writes=lambda self: 1 / 0), lambda t: t.apply_staged_writes(),
     "V2 apply_staged_writes: Edited.apply_staged_writes() raised ZeroDivisionError"),
    (dict(gather_block_tables=lambda self, idx, n: self._tables.inp[0]),
     lambda t: t.gather_block_tables(torch.zeros(0, dtype=torch.int32), 0), "expected one tensor per group (2)"),
])
def test_a_wrong_answer_is_the_class_finding(backend, methods, read, said):
    with pytest.raises(Discrepancy) as error:
        read(driven(backend, **methods))
    assert said in str(error.value), str(error.value)


def test_a_refusal_passes_on_to_be_compared_with_the_reference(backend):
    with pytest.raises(ValueError):
        driven(backend).append_block_ids(3, [[1], [2]], False)  # slot 3 of 3


def test_a_constructor_that_raises_is_named_with_its_arguments(backend):
    def init(self, **config):
        raise RuntimeError("no UVA")

    with pytest.raises(Discrepancy, match=r"V2 table class: Edited\(block_sizes=\[2, 4\].*RuntimeError: no UVA"):
        driven(backend, __init__=init)
