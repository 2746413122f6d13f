"""A class plug-in is checked whole before anything runs (docs/contract.md §11): a
class, its constructor's keywords, every method of the protocol by name and
parameters, and the free orders it declares. Each mistake is one PluginError line."""

from pathlib import Path

import pytest

from blocktable.classes.pool import Pool
from blocktable.classes.table import Table
from blocktable.plugin import PluginError, resolve_class
from blocktable.plugin.classes import POOL_CLASS, TABLE_CLASS, check_class

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pool_class.py"
TABLE_EXAMPLE = EXAMPLE.parent / "table_class.py"


def good_class(**changes):
    """A class with every method of the pool protocol, edited by `changes`."""
    body = {name: (lambda self, *args: None) for name in POOL_CLASS.methods}
    body["__init__"] = lambda self, *, num_blocks, null_block, prefix_caching, free_order: None
    body["free_orders"] = ("tail",)
    body.update(changes)
    body = {k: v for k, v in body.items() if v is not None}
    return type("Planted", (), body)


def test_ours_and_the_example_follow_the_protocol():
    check_class(Pool, "ours", POOL_CLASS)
    assert resolve_class("ours", "pool") is Pool
    assert resolve_class(f"{EXAMPLE}:ListPool", "pool").__name__ == "ListPool"
    check_class(Table, "ours", TABLE_CLASS)
    assert resolve_class("ours", "table") is Table
    assert resolve_class(f"{TABLE_EXAMPLE}:NumpyTable", "table").__name__ == "NumpyTable"


def good_table(**changes):
    """A class with every method of the V1 table protocol, edited by `changes`."""
    body = {name: (lambda self, *args: None) for name in TABLE_CLASS.methods}
    body["__init__"] = lambda self, **config: None
    body.update(changes)
    return type("PlantedTable", (), {k: v for k, v in body.items() if v is not None})


@pytest.mark.parametrize("cls, said", [
    (good_table(compute_slot_mapping=None), "no method compute_slot_mapping"),
    (good_table(move_row=lambda self, src: None), "the contract passes 2 (src, dst)"),
    (good_table(device_rows=lambda self: None), "the contract passes 1 (g)"),
    (good_table(__init__=lambda self, *, max_num_reqs, max_model_len: None),
     "missing keyword argument(s) max_num_batched_tokens, device, block_sizes"),
])
def test_each_mistake_of_a_table_class_is_named_in_one_line(cls, said):
    with pytest.raises(PluginError) as error:
        check_class(cls, "planted.py:PlantedTable", TABLE_CLASS)
    assert said in str(error.value) and "\n" not in str(error.value)
    check_class(good_table(), "planted.py:PlantedTable", TABLE_CLASS)  # the unedited class passes


@pytest.mark.parametrize("cls, said", [
    (lambda: None, "is not a class (it is a function)"),
    (good_class(touch=None), "no method touch"),
    (good_class(allocate=lambda self: []), "it takes 0 positional arguments, the contract passes 1 (n)"),
    (good_class(cache=lambda self, block, key, extra: None), "extra would have no value"),
    (good_class(__init__=lambda self, *, num_blocks, null_block, prefix_caching: None),
     "missing keyword argument(s) free_order"),
    (good_class(free_orders=None), "does not declare the free order it follows"),
    (good_class(free_orders=("lifo",)), "free_orders must be a non-empty tuple of tail, vllm"),
    (good_class(free_orders="tail"), "free_orders must be a non-empty tuple"),
])
def test_each_mistake_is_named_in_one_line(cls, said):
    with pytest.raises(PluginError) as error:
        check_class(cls, "planted.py:Planted", POOL_CLASS)
    assert said in str(error.value) and "\n" not in str(error.value)


def test_a_spec_naming_no_class_is_refused(tmp_path):
    path = tmp_path / "pools.py"
    path.write_text("def pool():\n    pass\n")
    with pytest.raises(PluginError, match="has no class 'Pool'"):
        resolve_class(f"{path}:Pool", "pool")
    with pytest.raises(PluginError, match="is not a class"):
        resolve_class(f"{path}:pool", "pool")
    with pytest.raises(PluginError, match="unknown pool class 'mine'"):
        resolve_class("mine", "pool")


def test_a_keyword_spelled_another_way_is_named_beside_the_missing_one():
    def init(self, *, max_num_reqs, max_model_len, max_num_batched_tokens, device, block_sizes, kernel_block_sizes,
             sharded, cp_world_size, cp_rank, cp_kv_cache_interleave_size):  # vLLM's name for cp_interleave
        pass

    with pytest.raises(PluginError) as error:
        check_class(good_table(__init__=init), "planted.py:PlantedTable", TABLE_CLASS)
    said = str(error.value)
    assert "missing keyword argument(s) cp_interleave" in said
    assert "(it takes cp_kv_cache_interleave_size, which the contract does not pass)" in said
