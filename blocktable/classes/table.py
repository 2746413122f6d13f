"""Our multi-group table (blocktable/groups.py) and slot-mapping kernel through
docs/contract.md §11's V1 table protocol, one object per DCP rank, as vLLM's
`MultiGroupBlockTable` is.

The protocol's lists (block sizes, kernel block sizes, sharding, interleave) hold
one entry per KV-cache group. `compute_slot_mapping` writes every group's whole
[max_num_batched_tokens] slot buffer, the -1 tail included, with our default
(tiled) kernel on the committed device rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from blocktable.device import current
from blocktable.groups import MultiGroupBlockTable
from blocktable.slot import slot_mapping_tiled
from blocktable.table import BlockTable


class Table:
    def __init__(self, *, max_num_reqs: int, max_model_len: int, max_num_batched_tokens: int,
                 device: torch.device | str, block_sizes: Sequence[int], kernel_block_sizes: Sequence[int],
                 sharded: Sequence[bool], cp_world_size: int, cp_rank: int, cp_interleave: Sequence[int]) -> None:
        backend = current()
        if torch.device(device) != backend.device:
            raise ValueError(f"this process runs its kernels on {backend.device}, not {device}")
        lists = {"kernel_block_sizes": kernel_block_sizes, "sharded": sharded, "cp_interleave": cp_interleave}
        for name, values in lists.items():
            if len(values) != len(block_sizes):
                raise ValueError(f"{name} has {len(values)} entries, block_sizes {len(block_sizes)}: one per group")
        if not 0 <= cp_rank < cp_world_size:
            raise ValueError(f"cp_rank {cp_rank} is out of range [0, {cp_world_size})")
        self._groups = MultiGroupBlockTable([
            BlockTable(max_num_reqs, max_model_len, kv_block_size=K, kernel_block_size=B, sharded=s,
                       cp_world_size=cp_world_size, cp_interleave=I, backend=backend)
            for K, B, s, I in zip(block_sizes, kernel_block_sizes, sharded, cp_interleave)])
        self._rank = cp_rank
        self._slots = [torch.full((max_num_batched_tokens,), -1, dtype=torch.int64, device=backend.device)
                       for _ in block_sizes]

    # -- row operations ------------------------------------------------------------------

    def add_row(self, ids: Sequence[Sequence[int]], row: int) -> None:
        self._groups.add_row(ids, row)

    def append_row(self, ids: Sequence[Sequence[int]], row: int) -> None:
        self._groups.append_row(ids, row)

    def clear_row(self, row: int) -> None:
        self._groups.clear_row(row)

    def move_row(self, src: int, dst: int) -> None:
        self._groups.move_row(src, dst)

    def swap_row(self, a: int, b: int) -> None:
        self._groups.swap_row(a, b)

    def commit_block_table(self, num_reqs: int) -> None:
        self._groups.commit(num_reqs)

    def clear(self) -> None:
        self._groups.clear()

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None:
        for table, out in zip(self._groups.tables, self._slots):
            # An unsharded group keeps every token on every rank (docs/contract.md §4).
            rank = self._rank if table.cp_world_size > 1 else 0
            slot_mapping_tiled(query_start_loc[:num_reqs + 1], positions, table.device_tensor, out,
                               kv_block_size=table.kv_block_size, kernel_block_size=table.kernel_block_size,
                               cp_world_size=table.cp_world_size, cp_rank=rank, cp_interleave=table.cp_interleave)

    # -- accessors -----------------------------------------------------------------------

    def host_rows(self, g: int) -> np.ndarray:
        return self._groups[g].host

    def counts(self, g: int) -> np.ndarray:
        return self._groups[g].count

    def device_rows(self, g: int) -> torch.Tensor:
        return self._groups[g].device_tensor

    def slot_mapping(self, g: int) -> torch.Tensor:
        return self._slots[g]
