"""A V2 block-table call (docs/contract.md §10) as case-file data, and running it
through a plug-in behind guards.

A call is a JSON object, exact on every machine:
- `op`: "append", "gather" or "slots" (the plug-in kind); `name`;
- `config`: BlockTables' construction arguments (`block_sizes`, `kernel_block_sizes`,
  `max_num_blocks_per_group`, `max_num_reqs`, `max_num_batched_tokens`, `cp_size`,
  `cp_rank`, `cp_interleave`, `dcp_sharded`, `slot_mapping_enabled`);
- `group_seeds` (one per group) and `synced`: the state before the call (v2/truth.py);
  `fill_seed`: the bits of every guard cell;
- `layout`: how every 2-D tensor sits in its buffer: `lead_rows` guard rows before and
  after it, `lead_cols` guard columns before each row, `pad` columns after it (the row
  stride is `lead_cols + width + pad`, rounded up to a multiple of 4 entries when
  `aligned`, which also keeps every interior 16-byte aligned);
- append: `appends`, the host calls that staged the writes, in order:
  `{"slot": r, "ids": [one list of allocation block ids per group], "overwrite": bool}`;
- gather: `idx_mapping`, `idx_dtype` ("int32" or "int64"), `num_reqs_padded`;
- slots: `idx_mapping`, `idx_dtype`, `query_start_loc` (entries past N are never read),
  `positions` (past T likewise), `num_tokens_padded`.

The kernel is called directly with the tensors docs/plugins.md describes, each the
interior of a larger flat buffer (kv/guard.py's Region): every buffer, guards and the
columns between rows included, is brought back and compared whole and bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from blocktable.properties import fault
from blocktable.properties.compare import Discrepancy, raised
from blocktable.properties.kv.guard import MIN_GUARD, Checks, Region, run_guarded
from blocktable.properties.outcome import Outcome
from blocktable.properties.v2 import compare
from blocktable.properties.v2.truth import CONFIG_KEYS, Plan, plan, tables, widths

OPS = ("append", "gather", "slots")
LAYOUT_KEYS = ("lead_rows", "lead_cols", "pad")
LIST_KEYS = ("block_sizes", "kernel_block_sizes", "max_num_blocks_per_group", "dcp_sharded", "slot_mapping_enabled")


def stride(width: int, layout: dict[str, Any]) -> int:
    """The row stride, in entries, of a 2-D tensor `width` entries wide."""
    s = layout["lead_cols"] + width + layout["pad"]
    return -(-s // 4) * 4 if layout["aligned"] else s


def matrix(name: str, dtype: str, array: np.ndarray, layout: dict[str, Any], seed: int, output: bool) -> Region:
    """`array` as a row-strided view into a buffer of guard rows and columns."""
    n, width = array.shape
    lead, left = layout["lead_rows"], layout["lead_cols"]
    region = Region(name, dtype, (n + 2 * lead, stride(width, layout)), MIN_GUARD,
                    {name: (slice(lead, lead + n), slice(left, left + width))}, output).fill(seed)
    region.host(region.bits(), name)[...] = array
    return region


def vector(name: str, array: np.ndarray, seed: int, modulus: int | None) -> Region:
    """An index input behind guards (of valid indices below `modulus`, where given)."""
    region = Region(name, str(array.dtype), array.shape, MIN_GUARD, {name: (slice(None),)}).fill(seed, modulus)
    region.host(region.bits(), name)[...] = array
    return region


def build(call: dict[str, Any]) -> tuple[list[Region], Callable, Callable, Checks, Plan]:
    """(regions, the truth, the kernel call, the checks, the reference's plan): see
    kv/guard.run_guarded."""
    op, seed, layout, config = call["op"], call["fill_seed"], call["layout"], call["config"]
    name = call.get("name", op)
    G, Rmax = len(config["block_sizes"]), config["max_num_reqs"]
    planned = plan(call)
    start, after = planned.before, planned.after
    regions = [matrix(f"rows {g}", "int32", start.rows[g], layout, seed, op == "append") for g in range(G)]
    checks = Checks()
    outputs: dict[str, np.ndarray] = {}
    if op == "append":
        regions.append(matrix("cnt_dev", "int32", start.cnt_dev, layout, seed, True))
        regions.append(matrix("cnt", "int32", planned.inputs["cnt"], layout, seed, False))
        E = len(planned.inputs["staged_ids"])
        moduli = {"staged_group": G, "staged_row": Rmax, "staged_start": max(widths(config)), "staged_ids": None,
                  "cu_staged": E + 1}
        regions += [vector(k, planned.inputs[k], seed, m) for k, m in moduli.items()]
        for g in range(G):
            outputs[f"rows {g}"] = after.rows[g]
            checks.compare.append((f"rows {g}", f"rows {g}", compare.checker(
                f"{name} rows", g, compare.append_rows(call, planned, g))))
        outputs["cnt_dev"] = after.cnt_dev
        checks.compare.append(("cnt_dev", "cnt_dev", compare.checker(f"{name} cnt_dev", None,
                                                                     compare.append_counts(planned))))
    elif op == "gather":
        regions.append(matrix("cnt_dev", "int32", start.cnt_dev, layout, seed, False))
        regions += [matrix(f"inp {g}", "int32", start.inp[g], layout, seed, True) for g in range(G)]
        regions.append(vector("idx_mapping", planned.inputs["idx_mapping"], seed, Rmax))
        for g in range(G):
            outputs[f"inp {g}"] = after.inp[g]
            checks.compare.append((f"inp {g}", f"inp {g}", compare.checker(
                f"{name} inp", g, compare.gather_rows(call, planned, g))))
    else:
        regions.append(matrix("slots", "int64", start.slots, layout, seed, True))
        T = int(planned.inputs["query_start_loc"][len(call["idx_mapping"])])
        for key, modulus in (("idx_mapping", Rmax), ("query_start_loc", T + 1), ("positions", None)):
            regions.append(vector(key, planned.inputs[key], seed, modulus))
        outputs["slots"] = after.slots
        checks.compare.append(("slots", "slots", compare.checker(f"{name} slots", None,
                                                                 compare.slot_entries(call, planned))))

    def truth(get: Callable) -> None:
        for key, array in outputs.items():
            get(key, key)[...] = array

    def kernel_call(kernel: Callable, get: Callable) -> None:
        rows = [get(f"rows {g}", f"rows {g}") for g in range(G)]
        if op == "append":
            kernel(rows, get("cnt_dev", "cnt_dev"), get("cnt", "cnt"),
                   *(get(k, k) for k in ("staged_group", "staged_row", "staged_start", "staged_ids", "cu_staged")))
        elif op == "gather":
            kernel(rows, get("cnt_dev", "cnt_dev"), [get(f"inp {g}", f"inp {g}") for g in range(G)],
                   get("idx_mapping", "idx_mapping"), planned.count)
        else:
            kernel(rows, get("idx_mapping", "idx_mapping"), get("query_start_loc", "query_start_loc"),
                   get("positions", "positions"), get("slots", "slots"), planned.count,
                   kv_block_sizes=list(config["block_sizes"]), kernel_block_sizes=list(config["kernel_block_sizes"]),
                   sharded=list(config["dcp_sharded"]), enabled=list(config["slot_mapping_enabled"]),
                   cp_world_size=config["cp_size"], cp_rank=config["cp_rank"], cp_interleave=config["cp_interleave"])

    return regions, truth, kernel_call, checks, planned


def run_v2_call(call: dict[str, Any], kernel: Callable, device: Any) -> Outcome:
    """Run the call through `kernel` on `device` behind guards; a failed Outcome holds
    the Discrepancy (a kernel's own exception as its cause)."""
    regions, truth, kernel_call, checks, _ = build(call)
    label = call.get("name", call["op"])
    try:
        run_guarded(regions, truth, lambda get: kernel_call(kernel, get), checks, device, label,
                    f"v2-{call['op']}")
    except Discrepancy as e:
        return Outcome(False, e)
    except Exception as e:
        fault.check(e)
        return Outcome(False, raised(f"{label} v2-{call['op']}", e))
    return Outcome(True)


# -- the schema (cases/schema.py checks a "v2-call" case's call with this) -----------------


def _int(v: Any, low: int | None = None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low)


def _ints(v: Any, low: int | None = None, high: int | None = None) -> bool:
    return isinstance(v, list) and all(_int(x, low) and (high is None or x <= high) for x in v)


def check_call(call: Any) -> dict[str, Any]:
    """The call, or ValueError naming the first problem (the message starts "call: ")."""
    def need(key: str, ok: Callable[[Any], bool], want: str, where: dict[str, Any] | None = None) -> Any:
        where = call if where is None else where
        if key not in where:
            raise ValueError(f"call: {key!r} is missing")
        if not ok(where[key]):
            raise ValueError(f"call: {key!r} must be {want}, not {where[key]!r}"[:200])
        return where[key]

    if not isinstance(call, dict):
        raise ValueError("call: must be an object")
    op = need("op", lambda v: v in OPS, f"one of {', '.join(OPS)}")
    config = need("config", lambda v: isinstance(v, dict), "an object")
    for key in CONFIG_KEYS:
        if key in LIST_KEYS:
            need(key, lambda v: isinstance(v, list) and len(v) > 0, "a list with one entry per group (at least one)",
                 config)
        else:
            need(key, lambda v: True, "", config)
    try:
        tables(config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"call: 'config' is not a valid V2 configuration: {e}") from None
    G = len(config["block_sizes"])
    need("group_seeds", lambda v: _ints(v, 0) and len(v) == G, f"{G} integers >= 0 (one per group)")
    need("synced", lambda v: isinstance(v, bool), "true or false")
    need("fill_seed", lambda v: _int(v, 0), "an integer >= 0")
    layout = need("layout", lambda v: isinstance(v, dict), "an object")
    for key in LAYOUT_KEYS:
        need(key, lambda v: _int(v, 0) and v <= 64, "an integer in [0, 64]", layout)
    need("aligned", lambda v: isinstance(v, bool), "true or false", layout)
    if op == "append":
        appends = need("appends", lambda v: isinstance(v, list) and all(isinstance(a, dict) for a in v),
                       "a list of objects")
        for a in appends:
            need("slot", _int, "an integer", a)
            need("ids", lambda v: isinstance(v, list) and len(v) == G and all(_ints(x) for x in v),
                 f"{G} lists of integers (one per group)", a)
            need("overwrite", lambda v: isinstance(v, bool), "true or false", a)
    else:
        need("idx_mapping", lambda v: _ints(v, -2**31, 2**31 - 1), "a list of int32 integers")
        need("idx_dtype", lambda v: v in ("int32", "int64"), "int32 or int64")
        if op == "gather":
            need("num_reqs_padded", _int, "an integer")
        else:
            need("query_start_loc", lambda v: _ints(v, -2**31, 2**31 - 1) and v, "a list of int32 integers")
            need("positions", lambda v: _ints(v, -2**63, 2**63 - 1), "a list of int64 integers")
            need("num_tokens_padded", _int, "an integer")
    try:
        plan(call)
    except (TypeError, ValueError) as e:
        raise ValueError(f"call: the reference refuses it, so the kernel would never be called: {e}") from None
    return call
