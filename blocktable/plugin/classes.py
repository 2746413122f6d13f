"""Class plug-ins (docs/contract.md §11): a user's table or pool class in place of
ours, named `MODULE:Class` or `FILE.py:Class` (or `ours`), and checked before
anything runs: its constructor takes the protocol's keywords, every method of the
protocol is there and takes the arguments the lockstep passes, and a pool declares
the free orders (§6) it follows.

    Table(*, max_num_reqs, max_model_len, max_num_batched_tokens, device, block_sizes,
          kernel_block_sizes, sharded, cp_world_size, cp_rank, cp_interleave)
        add_row(ids, row)   append_row(ids, row)   clear_row(row)   move_row(src, dst)
        swap_row(a, b)      commit_block_table(num_reqs)           clear()
        compute_slot_mapping(num_reqs, query_start_loc, positions)
        host_rows(g)  counts(g)  device_rows(g)  slot_mapping(g)     (g: a group)
    uniform_groups = True    (optional: every group sharded with one interleave, as vLLM's V1 class)

    TableV2(*, block_sizes, max_num_reqs, max_num_batched_tokens, max_num_blocks_per_group, device,
            kernel_block_sizes, cp_size, cp_rank, cp_interleave, dcp_sharded, slot_mapping_enabled)
        append_block_ids(r, new_block_ids, overwrite)   apply_staged_writes()
        gather_block_tables(idx_mapping, num_reqs_padded) -> one view per group
        compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens_padded) -> a view
        host_counts()  device_counts()  persistent_rows(g)  input_table(g)  slot_mappings()

    Pool(*, num_blocks, null_block, prefix_caching, free_order)
        allocate(n) -> list[int]        free(ids)          touch(ids)
        cache(block, key)               lookup(key) -> int | None
        reset_prefix_cache() -> bool    num_free() -> int  free_queue() -> list[int]
        ref(block) -> int               cache_map() -> list[tuple[key, list[int]]]
    free_orders = ("tail",) or ("vllm",) or both    (a class attribute)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blocktable.plugin.contract import Contract, check_parameters
from blocktable.plugin.spec import PluginError

FREE_ORDERS = ("tail", "vllm")


@dataclass(frozen=True)
class ClassContract:
    """What the lockstep calls on a kind of class: its constructor's keywords and each
    method's positional arguments, by name."""

    noun: str  # "pool class"
    constructor: tuple[str, ...]
    methods: dict[str, tuple[str, ...]]


POOL_CLASS = ClassContract(
    "pool class", ("num_blocks", "null_block", "prefix_caching", "free_order"),
    {"allocate": ("n",), "free": ("ids",), "touch": ("ids",), "cache": ("block", "key"), "lookup": ("key",),
     "reset_prefix_cache": (), "num_free": (), "free_queue": (), "ref": ("block",), "cache_map": ()})
TABLE_CLASS = ClassContract(
    "table class", ("max_num_reqs", "max_model_len", "max_num_batched_tokens", "device", "block_sizes",
                    "kernel_block_sizes", "sharded", "cp_world_size", "cp_rank", "cp_interleave"),
    {"add_row": ("ids", "row"), "append_row": ("ids", "row"), "clear_row": ("row",), "move_row": ("src", "dst"),
     "swap_row": ("a", "b"), "commit_block_table": ("num_reqs",), "clear": (),
     "compute_slot_mapping": ("num_reqs", "query_start_loc", "positions"),
     "host_rows": ("g",), "counts": ("g",), "device_rows": ("g",), "slot_mapping": ("g",)})
TABLE_V2_CLASS = ClassContract(
    "V2 table class", ("block_sizes", "max_num_reqs", "max_num_batched_tokens", "max_num_blocks_per_group", "device",
                       "kernel_block_sizes", "cp_size", "cp_rank", "cp_interleave", "dcp_sharded",
                       "slot_mapping_enabled"),
    {"append_block_ids": ("r", "new_block_ids", "overwrite"), "apply_staged_writes": (),
     "gather_block_tables": ("idx_mapping", "num_reqs_padded"),
     "compute_slot_mappings": ("idx_mapping", "query_start_loc", "positions", "num_tokens_padded"),
     "host_counts": (), "device_counts": (), "persistent_rows": ("g",), "input_table": ("g",),
     "slot_mappings": ()})
CLASS_CONTRACTS = {"table": TABLE_CLASS, "table-v2": TABLE_V2_CLASS, "pool": POOL_CLASS}
CLASS_KINDS = tuple(CLASS_CONTRACTS)  # --table, --table-v2, --pool


def replaces_slot_kernel(classes: Mapping[str, object]) -> bool:
    """Whether the class plug-ins named (by kind) include a table class, which computes
    its own slot mappings: then no slot-mapping kernel is under test, called, named in
    a summary or replayed."""
    return "table" in classes


def attribute(kind: str) -> str:
    """Where Plugins (and argparse) keep a class kind: `table-v2` -> `table_v2`."""
    return kind.replace("-", "_")


def builtin_classes(kind: str) -> dict[str, Callable[[], Callable]]:
    """Ours, through the same protocol: `ours` (blocktable.classes)."""
    def ours() -> type:
        if kind == "table":
            from blocktable.classes.table import Table

            return Table
        if kind == "table-v2":
            from blocktable.classes.table_v2 import TableV2

            return TableV2
        from blocktable.classes.pool import Pool

        return Pool

    return {"ours": ours}


def check_class(cls: Any, spec: str, contract: ClassContract) -> None:
    """PluginError unless `cls` is a class with the contract's constructor and methods,
    each taking what the lockstep passes; a pool also declares its free orders."""
    if not inspect.isclass(cls):
        raise PluginError(f"{spec} is not a class (it is a {type(cls).__name__}): a {contract.noun} is named "
                          f"MODULE:Class or FILE.py:Class")
    check_parameters(_signature(cls), f"{spec} (its constructor)",
                     Contract(f"{contract.noun}'s constructor", (), contract.constructor))
    missing = [name for name in contract.methods if not callable(getattr(cls, name, None))]
    if missing:
        raise PluginError(f"{spec} does not follow the {contract.noun} protocol: no method "
                          f"{', '.join(missing)} (docs/plugins.md lists the methods)")
    for name, arguments in contract.methods.items():
        method = inspect.getattr_static(cls, name)
        signature = _signature(getattr(cls, name))
        if signature is not None and not isinstance(method, (staticmethod, classmethod)):
            parameters = list(signature.parameters.values())[1:]  # self
            signature = signature.replace(parameters=parameters)
        check_parameters(signature, f"{spec}.{name}", Contract(f"{contract.noun}'s {name}", arguments, ()))
    if contract is POOL_CLASS:
        declared_free_orders(cls, spec)
    if contract is TABLE_CLASS:
        declared_uniform_groups(cls, spec)


def declared_free_orders(cls: Any, spec: str) -> tuple[str, ...]:
    """The §6 free orders a pool class says it follows (its `free_orders` attribute)."""
    orders = getattr(cls, "free_orders", None)
    if orders is None:
        raise PluginError(f"{spec} does not declare the free order it follows: give the class an attribute "
                          f"free_orders = (\"tail\",) (vLLM before #51482), (\"vllm\",) (since), or both")
    if isinstance(orders, str) or not isinstance(orders, (tuple, list)) or not orders \
            or any(order not in FREE_ORDERS for order in orders):
        raise PluginError(f"{spec}.free_orders must be a non-empty tuple of {', '.join(FREE_ORDERS)}, "
                          f"got {orders!r}")
    return tuple(orders)


def free_order_refusal(cls: Any, name: str, free_order: str) -> str | None:
    """Why a pool class cannot be built for a world freeing in `free_order` (one it
    does not declare), or None when it can."""
    orders = declared_free_orders(cls, name)
    if free_order in orders:
        return None
    return (f"the world frees in the {free_order!r} order (docs/contract.md §6) and the pool class {name} "
            f"declares free_orders {orders}")


def declared_uniform_groups(cls: Any, spec: str) -> bool:
    """Whether a table class asks for worlds whose groups are all sharded with one
    interleave (its `uniform_groups` attribute; False when it has none)."""
    uniform = getattr(cls, "uniform_groups", False)
    if not isinstance(uniform, bool):
        raise PluginError(f"{spec}.uniform_groups must be True or False, got {uniform!r}")
    return uniform


def uniform_groups_refusal(cls: Any, name: str, groups: list[Any], cp_world_size: int) -> str | None:
    """Why a table class declaring uniform groups cannot be built for a world of these
    groups (a replicated group, or two interleaves, under DCP), or None when it can."""
    if cp_world_size == 1 or not declared_uniform_groups(cls, name):
        return None
    if all(g.sharded for g in groups) and len({g.cp_interleave for g in groups}) == 1:
        return None
    return (f"the world's groups are not all sharded with one interleave under DCP (docs/contract.md §11) and the "
            f"table class {name} declares uniform_groups = True")


def world_refusal(plugins: Any, world: Any) -> str | None:
    """Why the class plug-ins of `plugins` (blocktable.plugin.Plugins) cannot be built
    for `world` (a pool's free order, a table's uniform groups), or None: a world a
    class cannot be built for is the user's choice of class, not a finding."""
    if plugins.pool is not None:
        refusal = free_order_refusal(plugins.pool, plugins.class_name("pool"), world.free_order)
        if refusal is not None:
            return refusal
    if plugins.table is not None:
        return uniform_groups_refusal(plugins.table, plugins.class_name("table"), world.groups, world.cp_world_size)
    return None


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins and C extensions: trust, the first call will tell
