"""docs/contract.md §4 vectorized, for checks too large for the token-by-token reference: the
stateless fuzz mode checks millions of tokens per second with it. It is written
once over the operators numpy arrays and torch tensors share, so the same code
runs in numpy (where tests prove it equal to `blocktable.reference.slot_mapping`)
and in torch on the GPU (where the stateless mode runs it)."""

from __future__ import annotations

from typing import Any

import numpy as np


def slot_mapping_vectorized(query_start_loc: Any, positions: Any, block_table: Any, max_num_tokens: int, *,
                            kv_block_size: int, kernel_block_size: int, cp_world_size: int = 1, cp_rank: int = 0,
                            cp_interleave: int = 1) -> Any:
    """int64 [max_num_tokens], numpy in -> numpy out, torch in -> torch out."""
    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave
    torch_mode = not isinstance(positions, np.ndarray)
    if torch_mode:
        import torch

        full = lambda n, v: torch.full((n,), v, dtype=torch.int64, device=positions.device)  # noqa: E731
        lengths = (query_start_loc[1:] - query_start_loc[:-1]).long()
        request = torch.repeat_interleave(torch.arange(len(lengths), device=positions.device), lengths)
        where = torch.where
    else:
        full = lambda n, v: np.full(n, v, dtype=np.int64)  # noqa: E731
        lengths = np.diff(query_start_loc.astype(np.int64))
        request = np.repeat(np.arange(len(lengths)), lengths)
        where = np.where
    T = len(positions)
    out = full(max_num_tokens, -1)
    if T == 0:
        return out
    p = positions
    VB = K * W
    vbi, vbo = p // VB, p % VB
    local = (vbo // I) % W == R
    lofs = (vbo // (W * I)) * I + vbo % I
    col = vbi * (K // B) + lofs // B
    width = block_table.shape[1]
    keep = local & (col < width)
    block = full(T, 0)
    block[keep] = block_table[request[keep], col[keep]].long() if torch_mode else block_table[request[keep], col[keep]]
    out[:T] = where(keep, block * B + lofs % B, -1)
    return out
