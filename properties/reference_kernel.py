"""The reference as a plug-in kernel (`--kernel reference`): the model against
itself, to check the harness end to end, and a baseline for third-party kernels."""

from __future__ import annotations

import torch

from blocktable.reference import slot_mapping


def reference_slot_mapping(query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                           slot_mapping_out: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                           cp_world_size: int, cp_rank: int, cp_interleave: int) -> None:
    out = slot_mapping(query_start_loc.cpu().numpy(), positions.cpu().numpy(), block_table.cpu().numpy(),
                       slot_mapping_out.numel(), kv_block_size=kv_block_size, kernel_block_size=kernel_block_size,
                       cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave)
    slot_mapping_out.copy_(torch.from_numpy(out))


def harness_kernels() -> dict:
    """Kernel names the harness adds to the implementation's built-ins."""
    return {"reference": lambda: reference_slot_mapping}
