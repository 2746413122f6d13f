"""docs/contract.md §9, the KV path, in numpy: write tokens into paged caches through a
slot mapping, copy whole blocks for copy-on-write, gather tokens back through a
block table. Each function loops over tokens (or pairs) as the contract states them.

Arrays and their types:
- `key`, `value`: `[>= n, H, D]`; float16, bfloat16 (a `uint16` array of bf16 bits:
  numpy has no bfloat16, see blocktable.reference.fp8) or float32. Rows past `n` are
  padding: the token count comes from the slot mapping.
- caches: `layout="NHD"`: `[num_blocks, Bk, H, D]`; `"HND"`: `[num_blocks, H, Bk, D]`.
  Any strides: views of one array (`buf[:, 0]`, `buf[:, 1]`) are written through.
  `kv_cache_dtype="auto"`: the key's dtype, and a write is a bit copy.
  `"fp8_e4m3"`: `uint8` e4m3fn codes of `float32(x) / float32(scale)` (every NaN 0x7F:
  see blocktable.reference.fp8).
- `k_scale`, `v_scale`: Python floats (ints allowed); the divisor or multiplier is
  `float32(scale)`, which must be finite and > 0. "auto" checks them and ignores them.
- `slot_mapping`: int64 `[n]`. `block_mapping`: int64 `[m, 2]` of (src, dst).
  `block_table`: int32 `[>= N, width]`. `cu_lens`: int32 `[N + 1]`, `cu_lens[0] = 0`,
  non-decreasing.
- gather's outputs: `[>= cu_lens[N], H, D]`; the cache's dtype for "auto" (a bit
  copy), float32 for "fp8_e4m3" (`decode(code) * float32(scale)` in float32; a NaN
  code gives float32 NaN 0x7FC00000 with the code's sign, never a product). Rows
  past `cu_lens[N]` keep what they held.

Every function checks its inputs first (this model has no switch for the
data-dependent checks: the harness runs with them on) and changes nothing when it
rejects them: TypeError for a wrong type or dtype, ValueError for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from blocktable.reference.fp8 import bfloat16_to_float32, decode_e4m3, encode_e4m3

LAYOUTS = ("NHD", "HND")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
# Input (and "auto" cache) dtypes; uint16 holds bfloat16 bits.
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.uint16), np.dtype(np.float32))
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == np.uint16 else str(dtype)


# ---- shapes and entries --------------------------------------------------------------

def cache_shape(layout: str, num_blocks: int, block_size: int, num_heads: int, head_size: int) -> tuple[int, ...]:
    """The shape of one cache in this layout."""
    check_layout(layout)
    if layout == "NHD":
        return (num_blocks, block_size, num_heads, head_size)
    return (num_blocks, num_heads, block_size, head_size)


def cache_sizes(shape: Sequence[int], layout: str) -> tuple[int, int, int, int]:
    """(num_blocks, Bk, H, D) of a cache shape in this layout."""
    num_blocks, a, b, head_size = shape
    return (num_blocks, a, b, head_size) if layout == "NHD" else (num_blocks, b, a, head_size)


def entry(cache: np.ndarray, layout: str, block: int, offset: int) -> np.ndarray:
    """The `[H, D]` view of one token's place in a cache: block `block`, offset `offset`."""
    return cache[block, offset] if layout == "NHD" else cache[block, :, offset]


def bits(a: np.ndarray) -> np.ndarray:
    """The same memory as unsigned integers: assigning through it moves bits and
    never converts a value (NaN payloads included)."""
    return a.view(_BITS[a.dtype.itemsize])


def to_float32(x: np.ndarray) -> np.ndarray:
    """Exact: every float16 and bfloat16 value is a float32."""
    return bfloat16_to_float32(x) if x.dtype == np.uint16 else x.astype(np.float32)


# ---- the three operations ------------------------------------------------------------

def write(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
          slot_mapping: np.ndarray, *, layout: str, kv_cache_dtype: str, k_scale: float = 1.0,
          v_scale: float = 1.0) -> None:
    """§9 Write: for t < n with s = slot_mapping[t] >= 0, block s // Bk, offset s % Bk
    receives key[t] (and value[t]). Nothing else in either cache changes."""
    n, block_size = check_write(key, value, key_cache, value_cache, slot_mapping, layout=layout,
                                kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale)
    for t in range(n):
        s = int(slot_mapping[t])
        if s < 0:
            continue  # padding or another rank's token: no write (vLLM #43810 wrote the last slot)
        block, offset = divmod(s, block_size)
        for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            place = entry(cache, layout, block, offset)
            if kv_cache_dtype == "auto":
                bits(place)[...] = bits(x[t])
            else:
                place[...] = quantize(x[t], scale)


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """fp8 e4m3fn codes of x / scale, the division in float32 (the input first made
    float32, exactly)."""
    with np.errstate(all="ignore"):  # inf / scale and overflow are meant: they saturate
        return encode_e4m3(to_float32(x) / np.float32(scale))


def dequantize(codes: np.ndarray, scale: float) -> np.ndarray:
    """decode(code) * scale in float32; a NaN code stays the decoder's NaN."""
    decoded = decode_e4m3(codes)
    with np.errstate(all="ignore"):
        product = decoded * np.float32(scale)
    return np.where(np.isnan(decoded), decoded, product)


def copy_blocks(key_caches: Sequence[np.ndarray], value_caches: Sequence[np.ndarray],
                block_mapping: np.ndarray) -> None:
    """§9 Copy: for every layer and pair (src, dst), block dst becomes equal to block
    src, all Bk * H * D elements, bit for bit. No dst repeats and none is also a src,
    so the order of the pairs does not matter."""
    check_copy(key_caches, value_caches, block_mapping)
    for key_cache, value_cache in zip(key_caches, value_caches):
        for src, dst in block_mapping.tolist():
            bits(key_cache[dst])[...] = bits(key_cache[src])
            bits(value_cache[dst])[...] = bits(value_cache[src])


def gather(key_cache: np.ndarray, value_cache: np.ndarray, block_table: np.ndarray, cu_lens: np.ndarray,
           out_key: np.ndarray, out_value: np.ndarray, *, layout: str, kv_cache_dtype: str,
           k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """§9 Gather: for request r and j < cu_lens[r+1] - cu_lens[r], out[cu_lens[r] + j]
    = the cache entry at block block_table[r, j // Bk], offset j % Bk (decoded and
    scaled for fp8). Rows of out past cu_lens[N] are left as they were."""
    block_size = check_gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, layout=layout,
                              kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale)
    for r in range(len(cu_lens) - 1):
        start = int(cu_lens[r])
        for j in range(int(cu_lens[r + 1]) - start):
            block, offset = int(block_table[r, j // block_size]), j % block_size
            for cache, out, scale in ((key_cache, out_key, k_scale), (value_cache, out_value, v_scale)):
                place = entry(cache, layout, block, offset)
                if kv_cache_dtype == "auto":
                    bits(out[start + j])[...] = bits(place)
                else:
                    out[start + j] = dequantize(place, scale)


# ---- input checks --------------------------------------------------------------------

def check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


def check_kv_cache_dtype(kv_cache_dtype: object) -> None:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")


def check_scale(name: str, scale: object) -> float:
    """float32(scale) as a Python float, or the error the contract asks for."""
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


def _array(name: str, a: object, dtype: npt.DTypeLike | None = None, ndim: int | None = None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name} must be {np.dtype(dtype)}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    return a


def _cache_pair(key: object, value: object, layout: str) -> tuple[int, int, int, int]:
    key_cache, value_cache = _array("key_cache", key, ndim=4), _array("value_cache", value, ndim=4)
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(f"value_cache is {value_cache.dtype} but key_cache is {key_cache.dtype}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache has shape {value_cache.shape} but key_cache {key_cache.shape}")
    return cache_sizes(key_cache.shape, layout)


def _cache_dtype(cache_dtype: np.dtype, data_dtype: np.dtype, kv_cache_dtype: str, data: str) -> None:
    if data_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{data} must be float16, bfloat16 or float32, got {dtype_name(data_dtype)}")
    if kv_cache_dtype == "auto" and cache_dtype != data_dtype:
        raise TypeError(f'kv_cache_dtype="auto": the caches must be {dtype_name(data_dtype)} like {data}, '
                        f"got {dtype_name(cache_dtype)}")
    if kv_cache_dtype == "fp8_e4m3" and cache_dtype != np.uint8:
        raise TypeError(f'kv_cache_dtype="fp8_e4m3": the caches must be uint8, got {dtype_name(cache_dtype)}')


def check_write(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                slot_mapping: np.ndarray, *, layout: str, kv_cache_dtype: str, k_scale: float,
                v_scale: float) -> tuple[int, int]:
    """(n, Bk), or the error the contract asks for."""
    check_layout(layout)
    check_kv_cache_dtype(kv_cache_dtype)
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)
    _array("slot_mapping", slot_mapping, np.int64, 1)
    _array("key", key, ndim=3)
    _array("value", value, ndim=3)
    if value.dtype != key.dtype:
        raise TypeError(f"value is {dtype_name(value.dtype)} but key is {dtype_name(key.dtype)}")
    num_blocks, block_size, H, D = _cache_pair(key_cache, value_cache, layout)
    _cache_dtype(key_cache.dtype, key.dtype, kv_cache_dtype, "key")
    n = len(slot_mapping)
    for name, x in (("key", key), ("value", value)):
        if x.shape[1:] != (H, D):
            raise ValueError(f"{name} is [tokens, H, D] = {list(x.shape)} but the caches hold H={H}, D={D}")
        if x.shape[0] < n:
            raise ValueError(f"{name} has {x.shape[0]} rows for {n} slots")
    check_slots(slot_mapping, num_blocks, block_size)
    return n, block_size


def check_slots(slot_mapping: np.ndarray, num_blocks: int, block_size: int) -> None:
    """The data-dependent checks of a write: every slot below num_blocks * Bk, and no
    non-negative slot given to two tokens (their writes would race)."""
    slots = slot_mapping.astype(np.int64)
    too_big = np.flatnonzero(slots >= num_blocks * block_size)
    if len(too_big):
        t = int(too_big[0])
        raise ValueError(f"write: slot {int(slots[t])} of token {t} lies outside the cache "
                         f"({num_blocks} blocks of {block_size})")
    seen: dict[int, int] = {}
    for t, s in enumerate(slots.tolist()):
        if s >= 0 and s in seen:
            raise ValueError(f"write: slot {s} is written by tokens {seen[s]} and {t} in one call")
        seen[s] = t


def check_copy(key_caches: Sequence[np.ndarray], value_caches: Sequence[np.ndarray],
               block_mapping: np.ndarray) -> None:
    if not isinstance(key_caches, (list, tuple)) or not isinstance(value_caches, (list, tuple)):
        raise TypeError("key_caches and value_caches must be lists (one cache per layer)")
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches")
    caches = [_array(f"{kind}_caches[{i}]", c) for kind, cs in (("key", key_caches), ("value", value_caches))
              for i, c in enumerate(cs)]
    for c in caches:
        if c.ndim != 4:
            raise ValueError(f"every cache must be 4-D, got shape {c.shape}")
        if c.dtype != caches[0].dtype:
            raise TypeError(f"the caches mix {caches[0].dtype} and {c.dtype}")
        if c.shape != caches[0].shape:
            raise ValueError(f"the caches mix shapes {caches[0].shape} and {c.shape}")
    _array("block_mapping", block_mapping, np.int64, 2)
    if block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [m, 2] (src, dst), got shape {block_mapping.shape}")
    num_blocks = caches[0].shape[0] if caches else 0
    check_pairs(block_mapping, num_blocks if caches else None)


def check_pairs(block_mapping: np.ndarray, num_blocks: int | None) -> None:
    """The data-dependent checks of a copy: ids inside the caches (when there are
    any), no dst twice, no dst that is also a src."""
    pairs = block_mapping.tolist()
    if num_blocks is not None:
        for src, dst in pairs:
            for block in (src, dst):
                if not 0 <= block < num_blocks:
                    raise ValueError(f"copy: block {block} of pair ({src}, {dst}) lies outside the caches' "
                                     f"{num_blocks} blocks")
    sources, destinations = {src for src, _ in pairs}, set()
    for _, dst in pairs:
        if dst in destinations:
            raise ValueError(f"copy: block {dst} is a destination twice")
        if dst in sources:
            raise ValueError(f"copy: block {dst} is both a source and a destination")
        destinations.add(dst)


def check_gather(key_cache: np.ndarray, value_cache: np.ndarray, block_table: np.ndarray, cu_lens: np.ndarray,
                 out_key: np.ndarray, out_value: np.ndarray, *, layout: str, kv_cache_dtype: str,
                 k_scale: float, v_scale: float) -> int:
    """Bk, or the error the contract asks for."""
    check_layout(layout)
    check_kv_cache_dtype(kv_cache_dtype)
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)
    num_blocks, block_size, H, D = _cache_pair(key_cache, value_cache, layout)
    _array("block_table", block_table, np.int32, 2)
    _array("cu_lens", cu_lens, np.int32, 1)
    _array("out_key", out_key, ndim=3)
    _array("out_value", out_value, ndim=3)
    if kv_cache_dtype == "auto":
        if key_cache.dtype not in FLOAT_DTYPES:
            raise TypeError(f"the caches must be float16, bfloat16 or float32, got {dtype_name(key_cache.dtype)}")
        out_dtype = key_cache.dtype
    else:
        if key_cache.dtype != np.uint8:
            raise TypeError(f'kv_cache_dtype="fp8_e4m3": the caches must be uint8, got {dtype_name(key_cache.dtype)}')
        out_dtype = np.dtype(np.float32)
    for name, out in (("out_key", out_key), ("out_value", out_value)):
        if out.dtype != out_dtype:
            raise TypeError(f"{name} must be {dtype_name(out_dtype)}, got {dtype_name(out.dtype)}")
        if out.shape[1:] != (H, D):
            raise ValueError(f"{name} is [tokens, H, D] = {list(out.shape)} but the caches hold H={H}, D={D}")
    if len(cu_lens) < 1:
        raise ValueError("cu_lens must hold N+1 >= 1 entries")
    N = len(cu_lens) - 1
    if block_table.shape[0] < N:
        raise ValueError(f"{N} requests but the block table has only {block_table.shape[0]} rows")
    check_lengths(cu_lens, block_table, num_blocks, block_size, min(out_key.shape[0], out_value.shape[0]))
    return block_size


def check_lengths(cu_lens: np.ndarray, block_table: np.ndarray, num_blocks: int, block_size: int,
                  out_rows: int) -> None:
    """The data-dependent checks of a gather: cu_lens starts at 0, never falls, ends
    within the outputs; every request fits its row; every block it reads exists."""
    cu = cu_lens.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_lens[0] must be 0, got {int(cu[0])}")
    falls = np.flatnonzero(cu[1:] < cu[:-1])
    if len(falls):
        r = int(falls[0])
        raise ValueError(f"cu_lens decreases at request {r}: {int(cu[r])} -> {int(cu[r + 1])}")
    if cu[-1] > out_rows:
        raise ValueError(f"cu_lens[N] = {int(cu[-1])} tokens but the outputs have {out_rows} rows")
    width = block_table.shape[1]
    for r in range(len(cu) - 1):
        length = int(cu[r + 1] - cu[r])
        if length > width * block_size:
            raise ValueError(f"request {r} has {length} tokens but its row holds {width} blocks of {block_size}")
        used = block_table[r, :-(-length // block_size)]
        outside = np.flatnonzero((used < 0) | (used >= num_blocks))
        if len(outside):
            c = int(outside[0])
            raise ValueError(f"gather: block_table[{r}, {c}] = {int(used[c])} lies outside the cache's "
                             f"{num_blocks} blocks")
