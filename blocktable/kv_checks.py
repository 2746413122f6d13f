"""The KV path's contract types and input checks (docs/contract.md §9), shared by our
Triton kernels (blocktable.kv) and the torch-native ones (blocktable.kv_torch).
Every check raises before any launch: TypeError for a wrong type or dtype,
ValueError for the rest (shapes, values, and a wrong device, as in
blocktable.device.check_tensor). The data-dependent checks (slots inside the cache
and not repeated; copy pairs inside the caches, no destination twice, none also a
source; cu_lens and the block ids a gather reads) read the device back and follow
blocktable.checks' `data_checks` switch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from blocktable.checks import data_checks_enabled
from blocktable.device import Backend, current, to_host

LAYOUTS = ("NHD", "HND")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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


def check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def check_kv_cache_dtype(kv_cache_dtype: object) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def check_scale(name: str, scale: object) -> float:
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


def _cache_pair(key: object, value: object, layout: str, backend: Backend) -> CacheSizes:
    key_cache, value_cache = _tensor("key_cache", key, 4, backend), _tensor("value_cache", value, 4, backend)
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
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)


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
