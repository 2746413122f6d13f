"""One KV group's caches as the lockstep keeps them (docs/contract.md §9): a key and a
value cache as views into one flat buffer, with GUARD cells before and after, the
same code over a numpy array (the reference's) and a torch tensor (the
implementation's); and where a flat cell lies, in the user's terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blocktable.properties.kv.mirror import view_cells
from blocktable.properties.world import KVConfig

GUARD = 64  # cells before and after each group's cache memory


@dataclass
class CachePair:
    """One group's key and value caches as views into one flat buffer with guard cells
    before and after: `host` (the reference's, numpy) or `device` (torch)."""

    flat: Any
    key: Any
    value: Any


def cache_pair(flat: Any, kv: KVConfig, blocks: int, block_size: int) -> CachePair:
    """The key and value views of `flat` (numpy or torch, GUARD cells each side)."""
    H, D, Dp = kv.num_heads, kv.head_size, kv.head_size + kv.pad
    inner = (block_size, H, Dp) if kv.layout == "NHD" else (H, block_size, Dp)
    size = blocks * 2 * block_size * H * Dp
    body = flat[GUARD:GUARD + size]
    if kv.joint:
        both = body.reshape((blocks, 2, *inner))
        key, value = both[:, 0], both[:, 1]
    else:
        half = size // 2
        key, value = body[:half].reshape((blocks, *inner)), body[half:].reshape((blocks, *inner))
    return CachePair(flat, key[..., :D], value[..., :D])


def cache_dtype(kv: KVConfig) -> str:
    """The dtype of a world's cache memory: the keys' own, or fp8 codes as bytes."""
    return kv.dtype if kv.kv_cache_dtype == "auto" else "uint8"


def out_dtype(kv: KVConfig) -> str:
    """The dtype a gather writes: the cache's, or float32 decoded from fp8."""
    return kv.dtype if kv.kv_cache_dtype == "auto" else "float32"


def kernel_options(kv: KVConfig) -> dict[str, Any]:
    """The keyword arguments every KV kernel call of a world with `kv` takes."""
    return dict(layout=kv.layout, kv_cache_dtype=kv.kv_cache_dtype, k_scale=kv.k_scale, v_scale=kv.v_scale)


def flat_size(kv: KVConfig, blocks: int, block_size: int) -> int:
    return 2 * GUARD + blocks * 2 * block_size * kv.num_heads * (kv.head_size + kv.pad)


def locate(pair: CachePair, index: int, kv: KVConfig, block_size: int,
           blocks_per_rank: int) -> tuple[str, int | None, int | None]:
    """Where flat cell `index` of the reference's buffer lies, in the user's terms, and
    the (rank, slot) of the cache element there (None, None: a guard or padding cell)."""
    if index < GUARD:
        return f"the guard cells before the caches (cell {index - GUARD})", None, None
    for name, view in (("key", pair.key), ("value", pair.value)):
        start, steps = view_cells(view, pair.flat)
        rest = index - start
        at = [0] * view.ndim
        for dim in sorted(range(view.ndim), key=lambda d: -steps[d]):
            at[dim] = rest // steps[dim] if steps[dim] else 0
            rest -= at[dim] * steps[dim]
        if rest == 0 and all(0 <= i < n for i, n in zip(at, view.shape)):
            blk, off, head = (at[0], at[1], at[2]) if kv.layout == "NHD" else (at[0], at[2], at[1])
            rank, block = divmod(blk, blocks_per_rank)
            slot = block * block_size + off
            return (f"{name} cache, rank {rank} block {block} offset {off} (slot {slot}) head {head} dim {at[3]}",
                    rank, slot)
    if index >= len(pair.flat) - GUARD:
        return f"the guard cells after the caches (cell {index - (len(pair.flat) - GUARD)})", None, None
    return "padding after a head's D (no cache element)", None, None
