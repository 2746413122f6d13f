"""SPEC §4 vectorized in numpy, for checks too large for the token-by-token
reference (GPU-sized batches, the stateless fuzz mode). It is proven equal to
`blocktable.reference.slot_mapping` by tests before it is trusted."""

from __future__ import annotations

import numpy as np


def slot_mapping_vectorized(query_start_loc: np.ndarray, positions: np.ndarray, block_table: np.ndarray,
                            max_num_tokens: int, *, kv_block_size: int, kernel_block_size: int,
                            cp_world_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1) -> np.ndarray:
    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave
    N = len(query_start_loc) - 1
    T = len(positions)
    out = np.full(max_num_tokens, -1, dtype=np.int64)
    if T == 0:
        return out
    lengths = np.diff(query_start_loc.astype(np.int64))
    request = np.repeat(np.arange(N), lengths)  # request of each token
    p = positions.astype(np.int64)
    VB = K * W
    vbi, vbo = p // VB, p % VB
    local = (vbo // I) % W == R
    lofs = (vbo // (W * I)) * I + vbo % I
    col = vbi * (K // B) + lofs // B
    width = block_table.shape[1]
    keep = local & (col < width)
    block = np.zeros(T, dtype=np.int64)
    block[keep] = block_table[request[keep], col[keep]]
    out[:T] = np.where(keep, block * B + lofs % B, -1)
    return out
