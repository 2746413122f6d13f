"""Torch-native versions of the KV path's three kernels (docs/contract.md §9): the same
contracts and checks as blocktable.kv, written with indexing ops (index_put_,
index_select and the like). They are the side-by-side baselines of the benchmark and
a second implementation for the tests; a plug-in written this way is what
examples/torch_kv_*.py show."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from blocktable.kv import E4M3_MAX, bits
from blocktable.kv_checks import check_copy, check_gather, check_scale, check_write


def _entries(cache: torch.Tensor, layout: str, block: torch.Tensor, offset: torch.Tensor) -> tuple:
    """The index of entries (block[i], offset[i]) of a cache: cache[index] is [m, H, D]
    in both layouts (torch puts the indexed dimension first when a slice splits them)."""
    return (block, offset) if layout == "NHD" else (block, slice(None), offset)


def quantize_torch(x: torch.Tensor, scale: float) -> torch.Tensor:
    """uint8 e4m3fn codes of float32(x) / float32(scale). The divisor is a tensor on x's
    device, since CUDA torch multiplies by the reciprocal of a host scalar (not the
    division); the clamp gives the saturation that torch's own cast lacked before
    pytorch/pytorch#178817 (it made NaN beyond ±448); torch keeps a NaN's sign on
    the CPU, where the contract stores 0x7F."""
    divisor = torch.full((1,), scale, dtype=torch.float32, device=x.device)
    y = (x.to(torch.float32) / divisor).clamp(-E4M3_MAX, E4M3_MAX)  # clamp keeps NaN
    codes = y.to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(y), 0x7F, codes).to(torch.uint8)


def dequantize_torch(codes: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 decode(code) * float32(scale); a NaN code gives 0x7FC00000 with its sign."""
    decoded = codes.view(torch.float8_e4m3fn).to(torch.float32)
    product = decoded * torch.full((1,), scale, dtype=torch.float32, device=codes.device)
    nan = torch.where(codes >= 0x80, -math.nan, math.nan).to(torch.float32)  # -nan: 0xFFC00000
    return torch.where(torch.isnan(decoded), nan, product)


def write_torch(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                slot_mapping: torch.Tensor, *, layout: str, kv_cache_dtype: str, k_scale: float = 1.0,
                v_scale: float = 1.0) -> None:
    """`write` with index_select and index_put_ (advanced-index assignment): select the
    tokens with a slot (a device sync), scatter them."""
    n, sizes = check_write(key, value, key_cache, value_cache, slot_mapping, layout=layout,
                           kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale)
    slots = slot_mapping[:n]
    tokens = torch.nonzero((slots >= 0) & (slots < sizes.num_blocks * sizes.block_size)).squeeze(1)  # syncs
    kept = slots[tokens]
    block, offset = kept // sizes.block_size, kept % sizes.block_size
    for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        rows = x.index_select(0, tokens)
        index = _entries(cache, layout, block, offset)
        if kv_cache_dtype == "auto":
            bits(cache)[index] = bits(rows)  # index_put_
        else:
            cache[index] = quantize_torch(rows, check_scale("", scale))


def copy_blocks_torch(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
                      block_mapping: torch.Tensor) -> None:
    """`copy_blocks` with index_select and index_copy_, layer by layer."""
    m = check_copy(key_caches, value_caches, block_mapping)
    if m == 0:
        return
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for cache in (*key_caches, *value_caches):
        bits(cache).index_copy_(0, dst, bits(cache).index_select(0, src))


def gather_torch(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                 cu_lens: torch.Tensor, out_key: torch.Tensor, out_value: torch.Tensor, *, layout: str,
                 kv_cache_dtype: str, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """`gather` with searchsorted and advanced indexing over every output row (rows
    past cu_lens[N] are rewritten with their own bits), without a device sync."""
    N, sizes = check_gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, layout=layout,
                            kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale)
    rows = min(out_key.shape[0], out_value.shape[0])
    if N == 0 or rows == 0 or sizes.num_blocks == 0 or block_table.shape[1] == 0:
        return
    cu = cu_lens.to(torch.int64)
    t = torch.arange(rows, device=cu.device)
    request = torch.searchsorted(cu[1:], t, right=True).clamp(max=N - 1)  # ends <= t: the requests before
    j = t - cu[request]
    column = (j // sizes.block_size).clamp(0, block_table.shape[1] - 1)
    block = block_table[request, column].to(torch.int64)
    valid = (t < cu[N]) & (block >= 0) & (block < sizes.num_blocks)
    block = torch.where(valid, block, 0)
    offset = j % sizes.block_size
    for cache, out, scale in ((key_cache, out_key, k_scale), (value_cache, out_value, v_scale)):
        entries = cache[_entries(cache, layout, block, offset)]
        if kv_cache_dtype == "fp8_e4m3":
            entries = dequantize_torch(entries, check_scale("", scale))
        mine = bits(out[:rows])
        mine.copy_(torch.where(valid[:, None, None], bits(entries), mine))
