"""A KV call (docs/contract.md §9) as case-file data, and running it through a kernel.

A call is a JSON object, exact on every machine: `op` ("write", "copy" or "gather"),
`layout`, `dtype` (the data's: float16, bfloat16, float32), `kv_cache_dtype`,
`k_scale`, `v_scale`, the cache geometry (`num_blocks`, `block_size`, `num_heads`,
`head_size`), how the caches are stored (`cache_form`: `joint` = the two caches are
halves of one `[num_blocks, 2, ...]` tensor, `pad` = elements past D in each head
row), and `fill_seed`, from which every buffer's bits before the call follow
(kv/guard.py). Then, by op:
- write: `slot_mapping`, `rows` (>= its length: the rest is padding), `key` and
  `value` as the bits of their `[rows, H, D]` elements (unsigned integers), and
  `input_form` (`joint`: key and value are slices of one `[rows, 3, H, D + pad]`);
- copy: `layers` and `block_mapping` (`[[src, dst], ...]`);
- gather: `block_table` (rows of `width` ids), `cu_lens`, `out_rows` (>= cu_lens[N]), `out_pad`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from blocktable.properties import fault
from blocktable.properties.compare import Discrepancy, raised
from blocktable.properties.kv import truth as kv_truth
from blocktable.properties.kv.compare import compare_cache, compare_gathered
from blocktable.properties.kv.data import HOST
from blocktable.properties.kv.guard import Checks, Region, run_guarded
from blocktable.properties.outcome import Outcome
from blocktable.reference.kv import bits, cache_shape

OPS = ("write", "copy", "gather")
DTYPES = ("float16", "bfloat16", "float32")


def cache_dtype(call: dict[str, Any]) -> str:
    return call["dtype"] if call["kv_cache_dtype"] == "auto" else "uint8"


def _cache_regions(call: dict[str, Any], prefix: str = "") -> list[Region]:
    """The caches of one layer: one region holding both, or one each."""
    H, D, pad = call["num_heads"], call["head_size"], call["cache_form"]["pad"]
    inner = list(cache_shape(call["layout"], call["num_blocks"], call["block_size"], H, D)[1:])
    inner[-1] += pad
    keep = (slice(None), slice(None), slice(0, D))
    if call["cache_form"]["joint"]:
        outer = (call["num_blocks"], 2, *inner)
        views = {"key_cache": (slice(None), 0, *keep), "value_cache": (slice(None), 1, *keep)}
        return [Region(f"{prefix}caches", cache_dtype(call), outer, max(64, math.prod(outer[1:])), views, True)]
    outer = (call["num_blocks"], *inner)
    return [Region(f"{prefix}{name}", cache_dtype(call), outer, max(64, math.prod(inner)),
                   {name: (slice(None), *keep)}, True) for name in ("key_cache", "value_cache")]


def _find(regions: list[Region], view: str, prefix: str = "") -> str:
    """The region holding `view` (of the layer named by `prefix`)."""
    return next(r.name for r in regions if r.name.startswith(prefix) and view in r.views)


def _index_region(name: str, dtype: str, values: np.ndarray, seed: int, modulus: int) -> Region:
    """An index input behind guards of valid indices below `modulus`."""
    region = Region(name, dtype, values.shape, 64, {name: tuple(slice(None) for _ in values.shape)}).fill(seed, modulus)
    region.host(region.bits(), name)[...] = values
    return region


def build(call: dict[str, Any], strict_nan: bool = False) -> tuple[list[Region], Callable, Callable, Checks]:
    """(regions, the truth, the kernel call, the checks) of a call: see run_guarded.
    `strict_nan`: NaN encodings compared exactly (docs/contract.md §9 lets them differ)."""
    op, seed = call["op"], call["fill_seed"]
    layout, Bk, H, D = call["layout"], call["block_size"], call["num_heads"], call["head_size"]
    options = {k: call[k] for k in ("layout", "kv_cache_dtype", "k_scale", "v_scale")}
    checks = Checks()
    label = f"{call.get('name', op)}"
    if op == "copy":
        regions = [r.fill(seed) for layer in range(call["layers"]) for r in _cache_regions(call, f"layer {layer} ")]
        pairs = np.array(call["block_mapping"], dtype=np.int64).reshape(-1, 2)
        regions.append(_index_region("block_mapping", "int64", pairs, seed, call["num_blocks"]))
        where = {(layer, v): _find(regions, v, f"layer {layer} ") for layer in range(call["layers"])
                 for v in ("key_cache", "value_cache")}
        views = ["key_cache", "value_cache"]

        def lists(get: Callable) -> tuple[list, list]:
            keys, values = ([get(where[layer, v], v) for layer in range(call["layers"])] for v in views)
            return keys, values

        def copy_truth(get: Callable) -> None:
            kv_truth.copy_blocks(*lists(get), pairs)

        def copy_call(kernel: Callable, get: Callable) -> None:
            kernel(*lists(get), get("block_mapping", "block_mapping"))

        owners = copy_owners(pairs, Bk)
        for layer in range(call["layers"]):
            for v in views:
                checks.compare.append((where[layer, v], v, _cache_check(f"{label} layer {layer} {v.replace('_', ' ')}",
                                                                        layout, Bk, owners, strict_nan)))
        return regions, copy_truth, copy_call, checks
    regions = [r.fill(seed) for r in _cache_regions(call)]
    if op == "write":
        slots = np.array(call["slot_mapping"], dtype=np.int64)
        rows, pad = call["rows"], call["input_form"]["pad"]
        keep = (slice(None), slice(0, D))
        if call["input_form"]["joint"]:
            inputs = [Region("qkv", call["dtype"], (rows, 3, H, D + pad), 64,
                             {"key": (slice(None), 1, *keep), "value": (slice(None), 2, *keep)})]
        else:
            inputs = [Region(v, call["dtype"], (rows, H, D + pad), 64, {v: (slice(None), *keep)})
                      for v in ("key", "value")]
        for region in inputs:
            region.fill(seed)
            for v in region.views:
                data = np.array(call[v], dtype=np.dtype(f"u{np.dtype(HOST[call['dtype']]).itemsize}"))
                bits(region.host(region.bits(), v))[...] = data.reshape(rows, H, D)
        regions += inputs
        regions.append(_index_region("slot_mapping", "int64", slots, seed, call["num_blocks"] * Bk))
        args = [(_find(regions, v), v) for v in ("key", "value", "key_cache", "value_cache")]
        args.append(("slot_mapping", "slot_mapping"))
        for v in ("key_cache", "value_cache"):
            checks.compare.append((_find(regions, v), v, _cache_check(f"{label} {v.replace('_', ' ')}", layout, Bk,
                                                                      write_owners(slots), strict_nan)))

        def truth(get: Callable) -> None:
            kv_truth.write(*(get(*a) for a in args), **options)
    else:
        table = np.array(call["block_table"], dtype=np.int32).reshape(-1, call["width"])
        cu = np.array(call["cu_lens"], dtype=np.int32)
        out_dtype = call["dtype"] if call["kv_cache_dtype"] == "auto" else "float32"
        regions.append(_index_region("block_table", "int32", table, seed, call["num_blocks"]))
        regions.append(_index_region("cu_lens", "int32", cu, seed, call["out_rows"] + 1))
        for v in ("out_key", "out_value"):
            regions.append(Region(v, out_dtype, (call["out_rows"], H, D + call["out_pad"]), 64,
                                  {v: (slice(None), slice(None), slice(0, D))}, True).fill(seed))
            decoded = int(cu[-1]) if call["kv_cache_dtype"] == "fp8_e4m3" else 0  # rows of decoded values
            checks.compare.append((v, v, _rows_check(f"{label} {v}", gather_owners(cu), decoded, strict_nan)))
        args = [(_find(regions, v), v) for v in ("key_cache", "value_cache")]
        args += [(v, v) for v in ("block_table", "cu_lens", "out_key", "out_value")]

        def truth(get: Callable) -> None:
            kv_truth.gather(*(get(*a) for a in args), **options)

    def kernel_call(kernel: Callable, get: Callable) -> None:
        kernel(*(get(*a) for a in args), **options)

    return regions, truth, kernel_call, checks


def _cache_check(what: str, layout: str, Bk: int, owners: Callable[[int], str], strict_nan: bool) -> Callable:
    return lambda e, a: compare_cache(what, e, a, layout=layout, block_size=Bk, owners=owners, strict_nan=strict_nan)


def _rows_check(what: str, rows: Callable[[int], str], nan_rows: int, strict_nan: bool) -> Callable:
    return lambda e, a: compare_gathered(what, e, a, rows=rows, nan_rows=nan_rows, strict_nan=strict_nan)


def write_owners(slots: np.ndarray) -> Callable[[int], str]:
    token = {int(s): t for t, s in enumerate(slots.tolist()) if s >= 0}
    return lambda slot: f"token {token[slot]}" if slot in token else "no token writes this slot: it must not change"


def copy_owners(pairs: np.ndarray, Bk: int) -> Callable[[int], str]:
    pair = {int(dst): i for i, (_, dst) in enumerate(pairs.tolist())}

    def owner(slot: int) -> str:
        i = pair.get(slot // Bk)
        if i is None:
            return f"block {slot // Bk} is no destination: it must not change"
        return f"pair {i}: block {int(pairs[i, 1])} becomes a copy of block {int(pairs[i, 0])}"
    return owner


def gather_owners(cu_lens: np.ndarray) -> Callable[[int], str]:
    cu = cu_lens.astype(np.int64)

    def owner(row: int) -> str:
        if row >= cu[-1]:
            return f"past cu_lens[N] = {int(cu[-1])}: it must not change"
        r = int(np.searchsorted(cu, row, side="right")) - 1
        return f"request {r} local index {row - int(cu[r])}"
    return owner


def run_kv_call(call: dict[str, Any], kernel: Callable, device: Any, strict_nan: bool = False) -> Outcome:
    """Run the call through `kernel` on `device` behind guards; a failed Outcome holds
    the Discrepancy (a kernel's own exception as its cause)."""
    regions, truth, kernel_call, checks = build(call, strict_nan)
    label = f"{call.get('name', call['op'])}"
    try:
        run_guarded(regions, truth, lambda get: kernel_call(kernel, get), checks, device, label,
                    f"kv-{call['op']}")
    except Discrepancy as e:
        return Outcome(False, e)
    except Exception as e:
        fault.check(e)
        return Outcome(False, raised(f"{label} kv-{call['op']}", e))
    return Outcome(True)


# -- the schema (cases/schema.py checks a "kv-call" case's call with this) -----------------


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _count(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


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
    need("layout", lambda v: v in ("NHD", "HND"), "NHD or HND")
    need("dtype", lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}")
    need("kv_cache_dtype", lambda v: v in ("auto", "fp8_e4m3"), "auto or fp8_e4m3")
    for key in ("k_scale", "v_scale"):
        need(key, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf,
             "a finite number > 0")
    blocks, Bk, H, D = (need(k, lambda v: _count(v, 1), "an integer >= 1")
                        for k in ("num_blocks", "block_size", "num_heads", "head_size"))
    need("fill_seed", _count, "an integer >= 0")
    form = need("cache_form", lambda v: isinstance(v, dict), "an object")
    need("joint", lambda v: isinstance(v, bool), "true or false", form)
    need("pad", _count, "an integer >= 0", form)
    if op == "write":
        slots = need("slot_mapping", _ints, "a list of integers")
        rows = need("rows", lambda v: _count(v, len(slots)), f"an integer >= {len(slots)} (the tokens)")
        for key in ("key", "value"):
            need(key, lambda v: _ints(v) and len(v) == rows * H * D, f"{rows * H * D} integers (rows x H x D bits)")
        form = need("input_form", lambda v: isinstance(v, dict), "an object")
        need("joint", lambda v: isinstance(v, bool), "true or false", form)
        need("pad", _count, "an integer >= 0", form)
        bad = [s for s in slots if s >= blocks * Bk]
        if bad:
            raise ValueError(f"call: slot {bad[0]} lies outside the cache ({blocks} blocks of {Bk})")
        taken = [s for s in slots if s >= 0]
        if len(set(taken)) != len(taken):
            raise ValueError("call: two tokens share a slot")
    elif op == "copy":
        need("layers", lambda v: _count(v, 1), "an integer >= 1")
        pairs = need("block_mapping", lambda v: isinstance(v, list) and all(_ints(p) and len(p) == 2 for p in v),
                     "a list of [src, dst] pairs")
        ids = [b for p in pairs for b in p]
        if any(not 0 <= b < blocks for b in ids):
            raise ValueError(f"call: a block id of 'block_mapping' lies outside the {blocks} blocks")
        dsts = [d for _, d in pairs]
        if len(set(dsts)) != len(dsts) or set(dsts) & {s for s, _ in pairs}:
            raise ValueError("call: the destinations of 'block_mapping' must be distinct and no source")
    else:
        width = need("width", lambda v: _count(v, 1), "an integer >= 1")
        table = need("block_table", lambda v: isinstance(v, list) and all(_ints(r) and len(r) == width for r in v),
                     f"a list of rows of {width} integers ('width')")
        cu = need("cu_lens", lambda v: _ints(v) and v and v[0] == 0 and all(b >= a for a, b in zip(v, v[1:])),
                  "a list of integers from 0, never decreasing")
        need("out_rows", lambda v: _count(v, cu[-1]), f"an integer >= cu_lens[N] = {cu[-1]}")
        need("out_pad", _count, "an integer >= 0")
        if len(table) < len(cu) - 1:
            raise ValueError(f"call: 'block_table' has {len(table)} rows for {len(cu) - 1} requests")
        for r in range(len(cu) - 1):
            used = -(-(cu[r + 1] - cu[r]) // Bk)
            if used > width or any(not 0 <= b < blocks for b in table[r][:used]):
                raise ValueError(f"call: request {r} reads past its row or outside the {blocks} blocks")
    return call
