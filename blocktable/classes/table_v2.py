"""Our V2 block tables (blocktable/v2.py) through docs/contract.md §11's V2 table
protocol: §10's operations as methods, and accessors for each part of §10.1's state.
One object per DCP rank, as vLLM's model runner V2 keeps one per rank's worker.

Under the Triton interpreter it runs our torch-native kernels, as the lockstep's
direct path does there: the interpreted Triton ones cost seconds a step."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from blocktable.device import current
from blocktable.v2 import TRITON_KERNELS, BlockTables
from blocktable.v2_torch import TORCH_KERNELS


class TableV2:
    def __init__(self, *, block_sizes: Sequence[int], max_num_reqs: int, max_num_batched_tokens: int,
                 max_num_blocks_per_group: Sequence[int], device: torch.device | str,
                 kernel_block_sizes: Sequence[int], cp_size: int, cp_rank: int, cp_interleave: int,
                 dcp_sharded: Sequence[bool], slot_mapping_enabled: Sequence[bool]) -> None:
        backend = current()
        if torch.device(device) != backend.device:
            raise ValueError(f"this process runs its kernels on {backend.device}, not {device}")
        kernels = TORCH_KERNELS if backend.interpreted else TRITON_KERNELS
        self._tables = BlockTables(block_sizes, max_num_reqs, max_num_batched_tokens, max_num_blocks_per_group,
                                   kernel_block_sizes, cp_size, cp_rank, cp_interleave, dcp_sharded,
                                   slot_mapping_enabled, backend=backend, kernels=kernels)

    # -- §10.3 to §10.7 ---------------------------------------------------------------------

    def append_block_ids(self, r: int, new_block_ids: Sequence[Sequence[int]], overwrite: bool) -> None:
        self._tables.append_block_ids(r, new_block_ids, overwrite)

    def apply_staged_writes(self) -> None:
        self._tables.apply_staged_writes()

    def gather_block_tables(self, idx_mapping: torch.Tensor, num_reqs_padded: int) -> tuple[torch.Tensor, ...]:
        return self._tables.gather_block_tables(idx_mapping, num_reqs_padded)

    def compute_slot_mappings(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                              positions: torch.Tensor, num_tokens_padded: int) -> torch.Tensor:
        return self._tables.compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens_padded)

    # -- §10.1's state --------------------------------------------------------------------------

    def host_counts(self) -> np.ndarray:
        return self._tables.cnt

    def device_counts(self) -> torch.Tensor:
        return self._tables.cnt_dev

    def persistent_rows(self, g: int) -> torch.Tensor:
        return self._tables.rows[g]

    def input_table(self, g: int) -> torch.Tensor:
        return self._tables.inp[g]

    def slot_mappings(self) -> torch.Tensor:
        return self._tables.slots
