"""The truth for one slot-mapping call (docs/contract.md §4), in two forms beside the
token-by-token reference (`blocktable.reference.slot_mapping`):

- `slot_mapping_vectorized`: §4 written once over the operators numpy arrays and torch
  tensors share, for checks too large for the token-by-token reference: the stateless
  fuzz mode checks millions of tokens per second with it. The same code runs in numpy
  (where tests prove it equal to the reference) and in torch on the GPU (where the
  stateless mode and the benchmark run it).
- `reference_slot_mapping`: the reference as a plug-in kernel (`--kernel reference`):
  the model against itself, to check the harness end to end, and a baseline for
  third-party kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from blocktable.reference import slot_mapping


def slot_mapping_vectorized(query_start_loc: Any, positions: Any, block_table: Any, max_num_tokens: int, *,
                            kv_block_size: int, kernel_block_size: int, cp_world_size: int = 1, cp_rank: int = 0,
                            cp_interleave: int = 1) -> Any:
    """int64 [max_num_tokens], numpy in -> numpy out, torch in -> torch out."""
    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave
    torch_mode = not isinstance(positions, np.ndarray)
    full: Callable[[int, int], Any]
    where: Callable[..., Any]
    request: Any
    if torch_mode:
        def full(n: int, v: int) -> Any:
            return torch.full((n,), v, dtype=torch.int64, device=positions.device)

        lengths = (query_start_loc[1:] - query_start_loc[:-1]).long()
        request = torch.repeat_interleave(torch.arange(len(lengths), device=positions.device), lengths)
        where = torch.where
    else:
        def full(n: int, v: int) -> Any:
            return np.full(n, v, dtype=np.int64)

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


def reference_slot_mapping(query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                           slot_mapping_out: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                           cp_world_size: int, cp_rank: int, cp_interleave: int) -> None:
    out = slot_mapping(query_start_loc.cpu().numpy(), positions.cpu().numpy(), block_table.cpu().numpy(),
                       slot_mapping_out.numel(), kv_block_size=kv_block_size, kernel_block_size=kernel_block_size,
                       cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave)
    slot_mapping_out.copy_(torch.from_numpy(out))


def harness_kernels() -> dict[str, Callable[[], Any]]:
    """Kernel names the harness adds to the implementation's built-ins."""
    return {"reference": lambda: reference_slot_mapping}
