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

import functools
from collections.abc import Sequence

import numpy as np
import torch

from blocktable.device import Backend, current
from blocktable.kv_checks import check_copy, check_gather, check_scale, check_write

E4M3_MAX = 448.0
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_WRITE_MODES = {torch.float16: "fp8_from_float16", torch.bfloat16: "fp8_from_bfloat16",
                torch.float32: "fp8_from_float32"}


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


@functools.cache
def converts_fp8(device: torch.device) -> bool:
    """Whether `device` is a GPU with fp8 conversion (compute capability 8.9 and up:
    Ada, Hopper and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def hardware_fp8(backend: Backend) -> bool:
    """Whether the fp8 write converts with the GPU's instruction rather than the
    integer encoder. Both give the codes of docs/contract.md §9; the interpreter has
    only the integer one."""
    return not backend.interpreted and converts_fp8(backend.device)


def reciprocal(scale: float) -> float:
    """RN(1 / scale) in float32: the kernel's division by scale starts from it."""
    with np.errstate(over="ignore"):
        return float(np.float32(1) / np.float32(scale))


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def aligned_strides(tensors: Sequence[torch.Tensor], strides: Sequence[Sequence[int]]) -> tuple[int, list[int]]:
    """The KV kernels' ALIGN for these tensors (blocktable.kernels.kv says why), and
    their strides as passed: each tensor's strides but the last (the one along D, or
    along a copy's row) divided by it. ALIGN is 16, the aligned compilation's, when
    every pointer is 16-byte aligned and every one of those strides a multiple of 16
    elements (what Triton's own specialization asks), else 1."""
    from blocktable.kernels.kv import ALIGNMENT

    aligned = all(t.data_ptr() % ALIGNMENT == 0 for t in tensors) and all(
        x % ALIGNMENT == 0 for each in strides for x in each[:-1])
    align = ALIGNMENT if aligned else 1
    return align, [x for each in strides for x in (*(y // align for y in each[:-1]), each[-1])]


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
    """(rows per program, warps) of copy: about 4K elements a program on a GPU, however
    few rows a block has (the rows per program are compiled in: one tile per row width
    rather than one per block shape), the whole block under the interpreter."""
    if backend.interpreted:
        return min(_next_power_of_2(rows), 1024), 1
    return max(1, 4096 // _next_power_of_2(inner)), 4


def search_steps(num_reqs: int) -> int:
    """The gather's binary-search halvings over `num_reqs` requests: ceil(log2) rounded
    up to a multiple of 4 (a halving of a window of one changes nothing), so that one
    compilation serves every batch of up to 16 requests, one every batch of 17 to 256,
    and so on, rather than one per power of two."""
    return 4 * -(-max(1, (num_reqs - 1).bit_length()) // 4)


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
    from blocktable.kernels.kv import write_tokens, write_tokens_unaligned

    if kv_cache_dtype == "auto":
        key, value, key_cache, value_cache = (bits(t) for t in (key, value, key_cache, value_cache))
        mode = "copy"
    else:
        mode = _WRITE_MODES[key.dtype]
        if key.dtype == torch.bfloat16:  # loaded as bits: the kernel widens them itself
            key, value = bits(key), bits(value)
    tokens, heads, warps = launch_tiles(backend, H, D)
    k, v = check_scale("k_scale", k_scale), check_scale("v_scale", v_scale)
    num_slots = sizes.num_blocks * sizes.block_size
    align, strides = aligned_strides((key, value, key_cache, value_cache), (
        key.stride(), value.stride(), cache_strides(key_cache, layout), cache_strides(value_cache, layout)))
    (write_tokens if align > 1 else write_tokens_unaligned)[(-(-n // tokens), -(-H // heads))](
        key, value, key_cache, value_cache, slot_mapping, slot_mapping.stride(0),
        n, num_slots, sizes.block_size, H, *strides, k, reciprocal(k), v, reciprocal(v),
        HEAD_SIZE=D, BLOCK_D=_next_power_of_2(D), TOKENS=tokens, HEADS=heads, EVEN_HEADS=H % heads == 0, MODE=mode,
        EXACT_DIVISION=not all(FAST_DIVISION_SCALES[0] <= x <= FAST_DIVISION_SCALES[1] for x in (k, v)),
        HARDWARE_FP8=mode != "copy" and hardware_fp8(backend), SLOTS_INT32=num_slots <= 2**31,
        ALIGN=align, num_warps=warps)


def copy_blocks(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
                block_mapping: torch.Tensor) -> None:
    """For every layer and pair (src, dst): block dst = block src, in both caches."""
    backend = current()
    m = check_copy(key_caches, value_caches, block_mapping, backend)
    if m == 0 or not key_caches or key_caches[0][0].numel() == 0:
        return
    from blocktable.kernels.kv import copy_blocks as kernel
    from blocktable.kernels.kv import copy_blocks_unaligned

    _, size_1, size_2, inner = key_caches[0].shape
    rows = size_1 * size_2
    per_program, warps = launch_rows(backend, rows, inner)
    for key_cache, value_cache in zip(key_caches, value_caches):  # one launch a layer: its own strides
        align, strides = aligned_strides((key_cache, value_cache), (key_cache.stride(), value_cache.stride()))
        (kernel if align > 1 else copy_blocks_unaligned)[(m, -(-rows // per_program))](
            bits(key_cache), bits(value_cache), block_mapping, *block_mapping.stride(), key_cache.shape[0],
            rows, size_2, *strides, INNER=inner, BLOCK_INNER=_next_power_of_2(inner), ROWS=per_program,
            ALIGN=align, num_warps=warps)


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
    from blocktable.kernels.kv import gather_tokens, gather_tokens_unaligned

    fp8 = kv_cache_dtype == "fp8_e4m3"
    if not fp8:
        key_cache, value_cache, out_key, out_value = (bits(t) for t in (key_cache, value_cache, out_key, out_value))
    tokens, heads, warps = launch_tiles(backend, H, D)
    align, strides = aligned_strides((key_cache, value_cache, out_key, out_value), (
        cache_strides(key_cache, layout), cache_strides(value_cache, layout), out_key.stride(), out_value.stride()))
    (gather_tokens if align > 1 else gather_tokens_unaligned)[(-(-rows // tokens), -(-H // heads))](
        key_cache, value_cache, block_table, *block_table.stride(), cu_lens, out_key, out_value,
        N, sizes.num_blocks, sizes.block_size, block_table.shape[1], rows, H,
        *strides, check_scale("k_scale", k_scale), check_scale("v_scale", v_scale),
        HEAD_SIZE=D, BLOCK_D=_next_power_of_2(D), TOKENS=tokens, HEADS=heads, EVEN_HEADS=H % heads == 0,
        SEARCH_STEPS=search_steps(N), FP8=fp8, ALIGN=align, num_warps=warps)
