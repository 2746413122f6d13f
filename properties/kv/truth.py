"""docs/contract.md §9 vectorized, for calls too large for blocktable.reference.kv's
token-by-token loops: the stateless KV mode checks every call with these. Same
conventions and same results as the reference (tests/properties/test_kv_truth.py
proves it on many small random calls); the fp8 arithmetic is the reference's own
(`quantize`, `dequantize`), applied to all tokens at once. The inputs are taken as
valid (the harness draws them so); the reference's checks are not repeated."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from blocktable.reference.kv import bits, dequantize, quantize


def _place(cache: np.ndarray, layout: str, block: np.ndarray, offset: np.ndarray) -> tuple:
    """The index of entries (block[i], offset[i]) as one `[m, H, D]` selection."""
    return (block, offset) if layout == "NHD" else (block, slice(None), offset)


def write(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
          slot_mapping: np.ndarray, *, layout: str, kv_cache_dtype: str, k_scale: float, v_scale: float) -> None:
    block_size = key_cache.shape[1] if layout == "NHD" else key_cache.shape[2]
    tokens = np.flatnonzero(slot_mapping >= 0)
    block, offset = np.divmod(slot_mapping[tokens].astype(np.int64), block_size)
    for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        index = _place(cache, layout, block, offset)
        if kv_cache_dtype == "auto":
            bits(cache)[index] = bits(x[tokens])
        else:
            cache[index] = quantize(x[tokens], scale)


def copy_blocks(key_caches: Sequence[np.ndarray], value_caches: Sequence[np.ndarray],
                block_mapping: np.ndarray) -> None:
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for cache in [*key_caches, *value_caches]:
        bits(cache)[dst] = bits(cache)[src]  # no dst is a src: the reads see the old blocks


def gathered_rows(cu_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(request, local index) of every output row below cu_lens[N]."""
    cu = cu_lens.astype(np.int64)
    request = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    return request, np.arange(int(cu[-1])) - cu[request]


def gather(key_cache: np.ndarray, value_cache: np.ndarray, block_table: np.ndarray, cu_lens: np.ndarray,
           out_key: np.ndarray, out_value: np.ndarray, *, layout: str, kv_cache_dtype: str, k_scale: float,
           v_scale: float) -> None:
    block_size = key_cache.shape[1] if layout == "NHD" else key_cache.shape[2]
    request, local = gathered_rows(cu_lens)
    rows = len(request)
    block = block_table[request, local // block_size].astype(np.int64)
    offset = local % block_size
    for cache, out, scale in ((key_cache, out_key, k_scale), (value_cache, out_value, v_scale)):
        entries = cache[_place(cache, layout, block, offset)]
        if kv_cache_dtype == "auto":
            bits(out)[:rows] = bits(entries)
        else:
            out[:rows] = dequantize(entries, scale)
