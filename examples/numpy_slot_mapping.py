"""An example plug-in: docs/contract.md §4 in numpy on tensors, as a third party might write it.

    blocktable fuzz --kernel examples/numpy_slot_mapping.py:slot_mapping

The harness calls it with the plug-in contract (docs/plugins.md). Note that
`block_table` may be a row-strided view (the harness surrounds it with guard
rows and columns): index it, never assume its rows are back to back.
"""

import numpy as np
import torch


def slot_mapping(query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                 slot_mapping: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                 cp_world_size: int, cp_rank: int, cp_interleave: int) -> None:
    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave
    starts = query_start_loc.cpu().numpy().astype(np.int64)
    tokens = positions.cpu().numpy()
    table = block_table.cpu().numpy()
    width = table.shape[1]
    out = np.full(slot_mapping.numel(), -1, dtype=np.int64)
    for request in range(len(starts) - 1):
        first, last = starts[request], starts[request + 1]
        p = tokens[first:last]
        in_virtual_block = p % (K * W)
        mine = (in_virtual_block // I) % W == R
        local = (in_virtual_block // (W * I)) * I + in_virtual_block % I
        column = (p // (K * W)) * (K // B) + local // B
        ok = mine & (column < width)
        block = np.zeros(len(p), dtype=np.int64)
        block[ok] = table[request, column[ok]]
        out[first:last] = np.where(ok, block * B + local % B, -1)
    slot_mapping.copy_(torch.from_numpy(out))
