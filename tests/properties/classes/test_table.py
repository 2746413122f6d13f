"""A table class under the lockstep (properties/classes/table.py): one object per DCP
rank, every call made on each; what the accessors return is checked on the way,
and a wrong answer, an exception that is not a refusal, or ranks that disagree is
the class's finding, named by the method, never a crash of the harness."""

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from blocktable.properties.classes.table import DrivenTables
from blocktable.properties.compare import Discrepancy
from blocktable.properties.world import GroupConfig

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "table_class.py"
WORLD = SimpleNamespace(groups=[GroupConfig(2, 1, True, 1), GroupConfig(1, 1, False)], cp_world_size=2,
                        max_num_reqs=3, max_model_len=8, max_num_batched_tokens=6)


def example():
    spec = importlib.util.spec_from_file_location("table_class_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NumpyTable


def driven(backend, **methods):
    """The example class with some methods replaced, one object per rank."""
    return DrivenTables.build(type("Edited", (example(),), methods), "Edited", WORLD, backend)


def test_every_rank_gets_an_object_and_every_call(backend):
    tables = driven(backend)
    assert len(tables.objects) == 2 and [t.rank for t in tables.objects] == [0, 1]
    tables.add_row([[1, 2], [3]], 0)
    tables.commit(1)
    for views in tables.ranks:
        # Group 0's blocks 1 and 2 are kernel blocks 2, 3 and 4, 5 (P = 2).
        assert views[0].host[0, :4].tolist() == [2, 3, 4, 5] and views[1].count.tolist() == [1, 0, 0]
        assert views[0].device_tensor[0, :4].tolist() == [2, 3, 4, 5] and views[0].width == views[0].host.shape[1]
    qsl, positions = np.array([0, 3], dtype=np.int32), np.array([0, 1, 2], dtype=np.int64)
    calls = tables.slot_calls(qsl, positions, 1, [2, 1])
    # Group 0 (K=2, B=1, W=2, I=1; row 0 = kernel blocks 2, 3, 4, 5): positions 0 and 2
    # are rank 0's (local offsets 0 and 1: kernel blocks 2 and 3), position 1 rank 1's
    # (local offset 0). Group 1 is unsharded (one rank): block 3, then the row's zeros.
    assert calls[0].check().tolist() == [[2, -1, 3, -1, -1, -1], [-1, 2, -1, -1, -1, -1]]
    assert calls[1].check().tolist() == [[3, 0, 0, -1, -1, -1]]


def test_a_refusal_passes_as_the_plain_type_for_comparison(backend):
    class Refused(ValueError):
        pass

    def append_row(self, ids, row):
        raise Refused("row overflows")

    tables = driven(backend, append_row=append_row)
    with pytest.raises(ValueError) as error:
        tables.append_row([[1], []], 0)
    assert type(error.value) is ValueError and "Refused: row overflows" in str(error.value)


@pytest.mark.parametrize("methods, call, said", [
    (dict(move_row=lambda self, src, dst: 1 / 0), lambda t: t.move_row(0, 1),
     "table move_row: Edited.move_row(0, 1) (the object for cp_rank 0) raised ZeroDivisionError"),
    (dict(host_rows=lambda self, g: self.groups[g].host.astype(np.int64)), lambda t: t[0].host,
     "Edited.host_rows(0) (the object for cp_rank 0) returned a numpy int64 array"),
    (dict(counts=lambda self, g: "none"), lambda t: t[1].count, "counts(1)"),
    (dict(device_rows=lambda self, g: self.groups[g].device.clone()), lambda t: t[0].pad_for_cuda_graph(1, 2),
     "device_rows must return that buffer"),
    (dict(slot_mapping=lambda self, g: self.groups[g].slots[:3]),
     lambda t: t.slot_calls(np.array([0, 1], np.int32), np.array([0], np.int64), 1, [2, 1]),
     "expected an int64 tensor of shape (6,)"),
])
def test_a_wrong_answer_is_the_class_finding(backend, methods, call, said):
    tables = driven(backend, **methods)
    with pytest.raises(Discrepancy) as error:
        call(tables)
    assert said in str(error.value), str(error.value)


def test_ranks_that_disagree_about_a_refusal_are_the_class_finding(backend):
    def clear_row(self, row):
        if self.rank == 1:
            raise ValueError("rank 1 refuses")

    with pytest.raises(Discrepancy, match="cp_rank 1.*where the object for cp_rank 0 accepted"):
        driven(backend, clear_row=clear_row).clear_row(0)


def test_an_input_the_class_changed_is_named(backend):
    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        positions.add_(1)

    tables = driven(backend, compute_slot_mapping=compute_slot_mapping)
    calls = tables.slot_calls(np.array([0, 2], np.int32), np.array([0, 1], np.int64), 1, [2, 1])
    with pytest.raises(Discrepancy, match="changed its input positions at index 0: 0 became 2"):
        calls[0].check()  # both ranks' objects added 1


def test_a_constructor_that_raises_is_named_with_its_arguments(backend):
    def init(self, **config):
        raise RuntimeError("no GPU group")

    with pytest.raises(Discrepancy, match=r"table class: Edited\(max_num_reqs=3, .*cp_rank=0.*RuntimeError"):
        driven(backend, __init__=init)


def test_rows_out_of_range_are_probed_on_a_new_table(backend):
    from blocktable.reference import GroupLayout
    from blocktable.reference import MultiGroupBlockTable as ReferenceGroups

    reference = ReferenceGroups(WORLD.max_num_reqs, WORLD.max_model_len,
                                [GroupLayout(2, 1, True, 2, 1), GroupLayout(1, 1, False, 1, 1)])
    driven(backend).probe_refusals(reference)  # the example refuses each

    def wraps(self, ids, row):  # checks the upper end only; numpy's negative index: row -1 is the last row
        if row >= self.max_num_reqs:
            raise ValueError(f"row {row} is out of range")
        for group, k in zip(self.groups, self._per_group(ids)):
            group.host[row, :len(k)] = k

    with pytest.raises(Discrepancy, match=r"Edited.append_row\(\(\[\], \[\]\), -1\).*was accepted"):
        driven(backend, append_row=wraps).probe_refusals(reference)

    def refuses_wrongly(self, src, dst):
        raise TypeError("dst")

    with pytest.raises(Discrepancy, match="is a ValueError"):
        driven(backend, move_row=refuses_wrongly).probe_refusals(reference)

    def clears_then_refuses(self, row):
        self.groups[0].device.fill_(7)
        raise ValueError("no such row")

    with pytest.raises(Discrepancy, match="table device rows.*refused with a row out of range"):
        driven(backend, clear_row=clears_then_refuses).probe_refusals(reference)


def test_a_class_declaring_uniform_groups_gets_them_and_says_why_not():
    from dataclasses import replace

    from blocktable.plugin import PluginError, world_refusal
    from blocktable.plugin.classes import TABLE_CLASS, check_class
    from blocktable.plugin.load import Plugins
    from blocktable.properties.lockstep.strategies import uniform_groups_of
    from blocktable.properties.world import WorldConfig

    mixed = WorldConfig(groups=(GroupConfig(4, 2, True, 2), GroupConfig(6, 6, False), GroupConfig(2, 1, True, 1)),
                        cp_world_size=2)
    uniform = uniform_groups_of(mixed)
    assert [(g.sharded, g.cp_interleave) for g in uniform.groups] == [(True, 2)] * 3  # gcd(2, 4, 6, 2)
    one = replace(mixed, groups=(GroupConfig(16, 16, True, 1),))
    assert uniform_groups_of(one) == one  # a world of one group keeps the interleave it drew (vLLM's default 1)
    assert [(g.kv_block_size, g.kernel_block_size) for g in uniform.groups] == [(4, 2), (6, 6), (2, 1)]
    alone = replace(mixed, cp_world_size=1)
    assert uniform_groups_of(alone) == alone  # without DCP, nothing to make uniform

    cls = type("Vllm", (example(),), {"uniform_groups": True})
    plugins = Plugins(None, None, classes={"table": "vllm_table.py:Vllm"}, table=cls)  # type: ignore[arg-type]
    said = world_refusal(plugins, mixed)
    assert said is not None and "vllm_table.py:Vllm declares uniform_groups = True" in said
    assert world_refusal(plugins, uniform) is None and world_refusal(plugins, alone) is None
    assert world_refusal(replace(plugins, table=example()), mixed) is None  # the example takes any world
    with pytest.raises(PluginError, match="uniform_groups must be True or False"):
        check_class(type("Bad", (example(),), {"uniform_groups": "yes"}), "bad.py:Bad", TABLE_CLASS)


@pytest.mark.parametrize("method, bad", [("clear_row", (-1,)), ("move_row", (-1, 0)), ("move_row", (0, -1)),
                                         ("swap_row", (0, -1)), ("add_row", (([], []), -1))])
def test_each_argument_of_each_row_operation_is_probed(backend, method, bad):
    from blocktable.reference import GroupLayout
    from blocktable.reference import MultiGroupBlockTable as ReferenceGroups

    reference = ReferenceGroups(WORLD.max_num_reqs, WORLD.max_model_len,
                                [GroupLayout(2, 1, True, 2, 1), GroupLayout(1, 1, False, 1, 1)])
    original = getattr(example(), method)

    def lax(self, *args):  # accepts this one call out of range (numpy's rows[-1] would), refuses the rest
        return None if args == bad else original(self, *args)

    shown = ", ".join(map(repr, bad))
    with pytest.raises(Discrepancy, match=rf"Edited\.{method}\({re.escape(shown)}\).*was accepted"):
        driven(backend, **{method: lax}).probe_refusals(reference)
