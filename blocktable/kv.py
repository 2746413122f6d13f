"""The KV path of docs/contract.md §9 (write, copy, gather) behind its plug-in contracts:

    write(key, value, key_cache, value_cache, slot_mapping, *, layout, kv_cache_dtype,
          k_scale, v_scale) -> None
    copy_blocks(key_caches, value_caches, block_mapping) -> None
    gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, *, layout,
           kv_cache_dtype, k_scale, v_scale) -> None

Two versions of each: ours (`write`, `copy_blocks`, `gather`: the Triton kernels of
blocktable.kernels.kv) and torch-native ones (`write_torch`, `copy_blocks_torch`,
`gather_torch`: indexing ops, the benchmark's side-by-side baselines). Both check
their inputs the same way before anything runs.

Types, as the contract leaves them to us:
- `key`, `value`: `[>= n, H, D]` float16, bfloat16 or float32, any strides; rows past
  `n = len(slot_mapping)` are never read.
- caches: `[num_blocks, Bk, H, D]` ("NHD") or `[num_blocks, H, Bk, D]` ("HND"), any
  strides (views of one tensor too). "auto": the key's dtype, written as a bit copy;
  "fp8_e4m3": uint8 holding e4m3fn codes of `float32(x) / float32(scale)`, rounded to
  nearest even, ±448 beyond the range, every NaN 0x7F (a GPU's division drops a NaN's
  sign, so the contract does).
- `k_scale`, `v_scale`: Python floats (or ints), not tensors: the divisor is
  `float32(scale)`, which must be finite and > 0. Checked for "auto" too, and ignored.
- `slot_mapping` int64 `[n]`; `block_mapping` int64 `[m, 2]` of (src, dst);
  `block_table` int32 `[>= N, width]`; `cu_lens` int32 `[N + 1]` with `cu_lens[0] = 0`,
  non-decreasing (like §4's query_start_loc). Any strides.
- gather's outputs `[>= cu_lens[N], H, D]`: the cache's dtype for "auto" (a bit
  copy); float32 for "fp8_e4m3" (`decode(code) * float32(scale)`; a NaN code gives the
  quiet NaN 0x7FC00000 with the code's sign). Rows past `cu_lens[N]` are left alone.
- copy: every cache of every layer has one shape and dtype (strides may differ).

Bad input raises before any launch: TypeError for a wrong type or dtype, ValueError
for the rest (shapes, values, and a wrong device, as in blocktable.device.check_tensor).
The data-dependent checks (slots inside the cache and not repeated; copy pairs inside
the caches, no destination twice, none also a source; cu_lens and the block ids a
gather reads) read the device back and follow blocktable.checks' `data_checks`
switch; with them off, the kernels still skip any slot or block outside the caches,
so bad data is never a stray access.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from blocktable.checks import data_checks_enabled
from blocktable.device import Backend, current, to_host

LAYOUTS = ("NHD", "HND")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
E4M3_MAX = 448.0
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_WRITE_MODES = {torch.float16: "fp8_from_float16", torch.bfloat16: "fp8_from_bfloat16",
                torch.float32: "fp8_from_float32"}


@dataclass(frozen=True)
class CacheSizes:
    num_blocks: int
    block_size: int
    num_heads: int
    head_size: int


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cache_sizes(cache: torch.Tensor, layout: str) -> CacheSizes:
    num_blocks, a, b, head_size = cache.shape
    return CacheSizes(num_blocks, a, b, head_size) if layout == "NHD" else CacheSizes(num_blocks, b, a, head_size)


def cache_strides(cache: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(block, offset in block, head, element of D) strides: the kernels' order."""
    s = cache.stride()
    return (s[0], s[1], s[2], s[3]) if layout == "NHD" else (s[0], s[2], s[1], s[3])


def bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory as integers of the same width (any strides): copies through it
    move bits and never convert a value."""
    return t.view(_BITS[t.element_size()])


# Scales for which the kernel divides in three operations rather than with IEEE
# division (blocktable.kernels.kv.quantize says why the range matters).
FAST_DIVISION_SCALES = (2.0**-64, 2.0**64)


def reciprocal(scale: float) -> float:
    """RN(1 / scale) in float32: the kernel's division by scale starts from it."""
    with np.errstate(over="ignore"):
        return float(np.float32(1) / np.float32(scale))


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def launch_tiles(backend: Backend, num_heads: int, head_size: int) -> tuple[int, int, int]:
    """(tokens, heads, warps) of a write or gather program. On a GPU a program moves
    about 4K elements of the key (and as many of the value), all heads of a token
    together where they fit in 2K, so that a token's slot or block is worked out once
    for all of them (with H = 8, D = 128: 4 tokens x 8 heads). The interpreter runs
    one program at a time as numpy, where fewer, wider programs cost less. Tests
    patch this to force several tiles and partial head groups."""
    heads = _next_power_of_2(num_heads)
    if backend.interpreted:
        return 64, heads, 1
    block_d = _next_power_of_2(head_size)
    heads = min(heads, max(1, 2048 // block_d))
    return max(1, 4096 // (heads * block_d)), heads, 4


def launch_rows(backend: Backend, rows: int, inner: int) -> tuple[int, int]:
    """(rows per program, warps) of copy: about 4K elements a program on a GPU, the
    whole block under the interpreter."""
    if backend.interpreted:
        return min(_next_power_of_2(rows), 1024), 1
    return max(1, min(_next_power_of_2(rows), 4096 // _next_power_of_2(inner))), 4


# ---- checks --------------------------------------------------------------------------

def check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def check_kv_cache_dtype(kv_cache_dtype: object) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def scale_float32(name: str, scale: object) -> float:
    """float32(scale) as a Python float (exactly what the kernels divide by)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(scale).__name__}")
    try:
        with np.errstate(over="ignore"):
            as_float32 = float(np.float32(scale))
    except OverflowError:  # an int too large for a float
        as_float32 = math.inf
    if not (math.isfinite(as_float32) and as_float32 > 0):
        raise ValueError(f"{name} must be finite and > 0 in float32, got {scale!r}")
    return as_float32


def _tensor(name: str, t: object, ndim: int, backend: Backend, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype_name(dtype)}, got {dtype_name(t.dtype)}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.device.type != backend.device.type:
        where = "CUDA tensors (the GPU backend)" if backend.name == "cuda" else "CPU tensors (the interpreter)"
        raise ValueError(f"{name} is on {t.device}, but kernels run on {backend.name}: pass {where}")
    return t


def _cache_pair(key_cache: object, value_cache: object, layout: str, backend: Backend) -> CacheSizes:
    _tensor("key_cache", key_cache, 4, backend)
    _tensor("value_cache", value_cache, 4, backend)
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(f"value_cache is {dtype_name(value_cache.dtype)} but key_cache is "
                        f"{dtype_name(key_cache.dtype)}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache has shape {tuple(value_cache.shape)} but key_cache {tuple(key_cache.shape)}")
    return cache_sizes(key_cache, layout)


def _check_options(layout: object, kv_cache_dtype: object, k_scale: object, v_scale: object) -> None:
    """The keyword arguments write and gather share."""
    check_layout(layout)
    check_kv_cache_dtype(kv_cache_dtype)
    scale_float32("k_scale", k_scale)
    scale_float32("v_scale", v_scale)


def check_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                slot_mapping: torch.Tensor, *, layout: str, kv_cache_dtype: str, k_scale: float, v_scale: float,
                backend: Backend | None = None) -> tuple[int, CacheSizes]:
    """(n, the caches' sizes), or the contract's error."""
    backend = backend or current()
    _check_options(layout, kv_cache_dtype, k_scale, v_scale)
    _tensor("slot_mapping", slot_mapping, 1, backend, torch.int64)
    _tensor("key", key, 3, backend)
    _tensor("value", value, 3, backend)
    if value.dtype != key.dtype:
        raise TypeError(f"value is {dtype_name(value.dtype)} but key is {dtype_name(key.dtype)}")
    sizes = _cache_pair(key_cache, value_cache, layout, backend)
    if key.dtype not in FLOAT_DTYPES:
        raise TypeError(f"key must be float16, bfloat16 or float32, got {dtype_name(key.dtype)}")
    if kv_cache_dtype == "auto" and key_cache.dtype != key.dtype:
        raise TypeError(f'kv_cache_dtype="auto": the caches must be {dtype_name(key.dtype)} like key, '
                        f"got {dtype_name(key_cache.dtype)}")
    if kv_cache_dtype == "fp8_e4m3" and key_cache.dtype != torch.uint8:
        raise TypeError(f'kv_cache_dtype="fp8_e4m3": the caches must be uint8, got {dtype_name(key_cache.dtype)}')
    n = slot_mapping.shape[0]
    H, D = sizes.num_heads, sizes.head_size
    for name, x in (("key", key), ("value", value)):
        if tuple(x.shape[1:]) != (H, D):
            raise ValueError(f"{name} is [tokens, H, D] = {list(x.shape)} but the caches hold H={H}, D={D}")
        if x.shape[0] < n:
            raise ValueError(f"{name} has {x.shape[0]} rows for {n} slots")
    if data_checks_enabled() and n:
        check_slots(to_host([slot_mapping])[0], sizes.num_blocks, sizes.block_size)
    return n, sizes


def check_slots(slots: np.ndarray, num_blocks: int, block_size: int) -> None:
    """Every slot below num_blocks * Bk, and no non-negative slot given to two tokens
    (their writes would race). Errors name the first offending token."""
    too_big = np.flatnonzero(slots >= num_blocks * block_size)
    if len(too_big):
        t = int(too_big[0])
        raise ValueError(f"write: slot {int(slots[t])} of token {t} lies outside the cache "
                         f"({num_blocks} blocks of {block_size})")
    order = np.argsort(slots, kind="stable")  # equal slots stay in token order
    ordered = slots[order]
    repeat = np.flatnonzero((ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)) + 1
    if len(repeat):
        second = int(order[repeat].min())  # the first token whose slot an earlier token took
        s = int(slots[second])
        first = int(np.flatnonzero(slots == s)[0])
        raise ValueError(f"write: slot {s} is written by tokens {first} and {second} in one call")


def check_copy(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
               block_mapping: torch.Tensor, backend: Backend | None = None) -> int:
    """m, the number of pairs, or the contract's error."""
    backend = backend or current()
    if not isinstance(key_caches, (list, tuple)) or not isinstance(value_caches, (list, tuple)):
        raise TypeError("key_caches and value_caches must be lists (one cache per layer)")
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches")
    caches = [c for pair in zip(key_caches, value_caches) for c in pair]
    for i, c in enumerate(caches):
        _tensor(f"{('key', 'value')[i % 2]}_caches[{i // 2}]", c, 4, backend)
        if c.dtype != caches[0].dtype:
            raise TypeError(f"the caches mix {dtype_name(caches[0].dtype)} and {dtype_name(c.dtype)}")
        if c.shape != caches[0].shape:
            raise ValueError(f"the caches mix shapes {tuple(caches[0].shape)} and {tuple(c.shape)}")
    _tensor("block_mapping", block_mapping, 2, backend, torch.int64)
    if block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [m, 2] (src, dst), got shape {tuple(block_mapping.shape)}")
    m = block_mapping.shape[0]
    if data_checks_enabled() and m:
        check_pairs(to_host([block_mapping])[0], caches[0].shape[0] if caches else None)
    return m


def check_pairs(pairs: np.ndarray, num_blocks: int | None) -> None:
    """Block ids inside the caches (when there are any), no destination twice, none
    that is also a source: then the pairs can be copied in any order, or all at once."""
    if num_blocks is not None:
        outside = np.flatnonzero(((pairs < 0) | (pairs >= num_blocks)).any(axis=1))
        if len(outside):
            src, dst = (int(b) for b in pairs[outside[0]])
            block = src if not 0 <= src < num_blocks else dst
            raise ValueError(f"copy: block {block} of pair ({src}, {dst}) lies outside the caches' "
                             f"{num_blocks} blocks")
    sources = set(pairs[:, 0].tolist())
    destinations: set[int] = set()
    for dst in pairs[:, 1].tolist():
        if dst in destinations:
            raise ValueError(f"copy: block {dst} is a destination twice")
        if dst in sources:
            raise ValueError(f"copy: block {dst} is both a source and a destination")
        destinations.add(dst)


def check_gather(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                 cu_lens: torch.Tensor, out_key: torch.Tensor, out_value: torch.Tensor, *, layout: str,
                 kv_cache_dtype: str, k_scale: float, v_scale: float,
                 backend: Backend | None = None) -> tuple[int, CacheSizes]:
    """(N, the caches' sizes), or the contract's error."""
    backend = backend or current()
    _check_options(layout, kv_cache_dtype, k_scale, v_scale)
    sizes = _cache_pair(key_cache, value_cache, layout, backend)
    _tensor("block_table", block_table, 2, backend, torch.int32)
    _tensor("cu_lens", cu_lens, 1, backend, torch.int32)
    _tensor("out_key", out_key, 3, backend)
    _tensor("out_value", out_value, 3, backend)
    if kv_cache_dtype == "auto":
        if key_cache.dtype not in FLOAT_DTYPES:
            raise TypeError(f"the caches must be float16, bfloat16 or float32, got {dtype_name(key_cache.dtype)}")
        out_dtype = key_cache.dtype
    else:
        if key_cache.dtype != torch.uint8:
            raise TypeError(f'kv_cache_dtype="fp8_e4m3": the caches must be uint8, got {dtype_name(key_cache.dtype)}')
        out_dtype = torch.float32
    H, D = sizes.num_heads, sizes.head_size
    for name, out in (("out_key", out_key), ("out_value", out_value)):
        if out.dtype != out_dtype:
            raise TypeError(f"{name} must be {dtype_name(out_dtype)}, got {dtype_name(out.dtype)}")
        if tuple(out.shape[1:]) != (H, D):
            raise ValueError(f"{name} is [tokens, H, D] = {list(out.shape)} but the caches hold H={H}, D={D}")
    if cu_lens.shape[0] < 1:
        raise ValueError("cu_lens must hold N+1 >= 1 entries")
    N = cu_lens.shape[0] - 1
    if block_table.shape[0] < N:
        raise ValueError(f"{N} requests but the block table has only {block_table.shape[0]} rows")
    if data_checks_enabled():
        cu, table = to_host([cu_lens, block_table[:N]])
        check_lengths(cu, table, sizes.num_blocks, sizes.block_size, min(out_key.shape[0], out_value.shape[0]))
    return N, sizes


def check_lengths(cu_lens: np.ndarray, table: np.ndarray, num_blocks: int, block_size: int, out_rows: int) -> None:
    """cu_lens starts at 0, never falls and ends within the outputs; each request fits
    its row of `table` (rows [:N]); every block it reads lies inside the cache."""
    cu = cu_lens.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_lens[0] must be 0, got {int(cu[0])}")
    falls = np.flatnonzero(cu[1:] < cu[:-1])
    if len(falls):
        r = int(falls[0])
        raise ValueError(f"cu_lens decreases at request {r}: {int(cu[r])} -> {int(cu[r + 1])}")
    if cu[-1] > out_rows:
        raise ValueError(f"cu_lens[N] = {int(cu[-1])} tokens but the outputs have {out_rows} rows")
    lengths = cu[1:] - cu[:-1]
    width = table.shape[1]
    too_long = np.flatnonzero(lengths > width * block_size)
    if len(too_long):
        r = int(too_long[0])
        raise ValueError(f"request {r} has {int(lengths[r])} tokens but its row holds {width} blocks of {block_size}")
    used = np.arange(width)[None, :] < -(-lengths[:, None] // block_size)  # the columns each request reads
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"gather: block_table[{r}, {c}] = {int(table[r, c])} lies outside the cache's "
                         f"{num_blocks} blocks")


# ---- ours: the Triton kernels --------------------------------------------------------

def write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
          slot_mapping: torch.Tensor, *, layout: str, kv_cache_dtype: str, k_scale: float = 1.0,
          v_scale: float = 1.0) -> None:
    """Write token t < n into slot slot_mapping[t] of both caches (slots < 0: nothing)."""
    backend = current()
    n, sizes = check_write(key, value, key_cache, value_cache, slot_mapping, layout=layout,
                           kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale, backend=backend)
    H, D = sizes.num_heads, sizes.head_size
    if n == 0 or H == 0 or D == 0:
        return
    from blocktable.kernels.kv import write_tokens

    if kv_cache_dtype == "auto":
        key, value, key_cache, value_cache = (bits(t) for t in (key, value, key_cache, value_cache))
        mode = "copy"
    else:
        mode = _WRITE_MODES[key.dtype]
        if key.dtype == torch.bfloat16:  # loaded as bits: the kernel widens them itself
            key, value = bits(key), bits(value)
    tokens, heads, warps = launch_tiles(backend, H, D)
    k, v = scale_float32("k_scale", k_scale), scale_float32("v_scale", v_scale)
    num_slots = sizes.num_blocks * sizes.block_size
    write_tokens[(-(-n // tokens), -(-H // heads))](
        key, value, key_cache, value_cache, slot_mapping, slot_mapping.stride(0),
        n, num_slots, sizes.block_size, H,
        *key.stride(), *value.stride(), *cache_strides(key_cache, layout), *cache_strides(value_cache, layout),
        k, reciprocal(k), v, reciprocal(v),
        HEAD_SIZE=D, BLOCK_D=_next_power_of_2(D), TOKENS=tokens, HEADS=heads, EVEN_HEADS=H % heads == 0, MODE=mode,
        EXACT_DIVISION=not all(FAST_DIVISION_SCALES[0] <= x <= FAST_DIVISION_SCALES[1] for x in (k, v)),
        SLOTS_INT32=num_slots <= 2**31, num_warps=warps)


def copy_blocks(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    """For every layer and pair (src, dst): block dst = block src, in both caches."""
    backend = current()
    m = check_copy(key_caches, value_caches, block_mapping, backend)
    if m == 0 or not key_caches or key_caches[0][0].numel() == 0:
        return
    from blocktable.kernels.kv import copy_blocks as kernel

    _, size_1, size_2, inner = key_caches[0].shape
    rows = size_1 * size_2
    per_program, warps = launch_rows(backend, rows, inner)
    for key_cache, value_cache in zip(key_caches, value_caches):  # one launch a layer: its own strides
        kernel[(m, -(-rows // per_program))](
            bits(key_cache), bits(value_cache), block_mapping, *block_mapping.stride(), key_cache.shape[0],
            rows, size_2, *key_cache.stride(), *value_cache.stride(),
            INNER=inner, BLOCK_INNER=_next_power_of_2(inner), ROWS=per_program, num_warps=warps)


def gather(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, cu_lens: torch.Tensor,
           out_key: torch.Tensor, out_value: torch.Tensor, *, layout: str, kv_cache_dtype: str,
           k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """out[cu_lens[r] + j] = the cache entry of request r's token j, through its row."""
    backend = current()
    N, sizes = check_gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, layout=layout,
                            kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale, backend=backend)
    rows = min(out_key.shape[0], out_value.shape[0])
    H, D = sizes.num_heads, sizes.head_size
    if N == 0 or rows == 0 or H == 0 or D == 0:
        return
    from blocktable.kernels.kv import gather_tokens

    fp8 = kv_cache_dtype == "fp8_e4m3"
    if not fp8:
        key_cache, value_cache, out_key, out_value = (bits(t) for t in (key_cache, value_cache, out_key, out_value))
    tokens, heads, warps = launch_tiles(backend, H, D)
    gather_tokens[(-(-rows // tokens), -(-H // heads))](
        key_cache, value_cache, block_table, *block_table.stride(), cu_lens, out_key, out_value,
        N, sizes.num_blocks, sizes.block_size, block_table.shape[1], rows, H,
        *cache_strides(key_cache, layout), *cache_strides(value_cache, layout), *out_key.stride(),
        *out_value.stride(), scale_float32("k_scale", k_scale), scale_float32("v_scale", v_scale),
        HEAD_SIZE=D, BLOCK_D=_next_power_of_2(D), TOKENS=tokens, HEADS=heads, EVEN_HEADS=H % heads == 0,
        SEARCH_STEPS=max(0, N - 1).bit_length(), FP8=fp8, num_warps=warps)
