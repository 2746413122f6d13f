"""The data-level oracle on the device (SPEC §7): one rank's paged KV cache holding
one int64 value per token, written through a slot mapping, copied block by block
for copy-on-write, and read back through block-table rows.

The harness writes a distinct value for every (sequence, position); reading every
live sequence back must give the reference's history, whichever blocks the pool
chose. Slots are checked before every launch, so a bad slot is a clear error here,
never a stray write on the GPU.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from blocktable.device import Backend, check_tensor, current

TOKENS_PER_PROGRAM = 1024


class DeviceCache:
    def __init__(self, num_slots: int, slot_base: int = 0, backend: Backend | None = None) -> None:
        from blocktable.kernels.kv_oracle import POISON_VALUE

        self.backend = backend or current()
        self.slot_base = slot_base
        self.num_slots = num_slots
        self.data = torch.full((num_slots,), POISON_VALUE, dtype=torch.int64, device=self.backend.device)

    def state_snapshot(self) -> dict[str, np.ndarray]:
        return {"data": self.values().copy()}

    def _check_slots(self, slots: torch.Tensor, what: str) -> None:
        used = slots[slots >= 0] - self.slot_base
        outside = (used < 0) | (used >= self.num_slots)
        if bool(outside.any()):
            bad = int(used[outside][0]) + self.slot_base
            raise ValueError(f"{what}: slot {bad} lies outside the cache [{self.slot_base}, "
                             f"{self.slot_base + self.num_slots})")

    def write(self, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
        """cache[slot_mapping[t]] = values[t] for t < len(values), skipping slots < 0."""
        from blocktable.kernels.kv_oracle import write_values

        check_tensor("slot_mapping", slot_mapping, torch.int64, 1, self.backend)
        check_tensor("values", values, torch.int64, 1, self.backend)
        T = values.numel()
        if T > slot_mapping.numel():
            raise ValueError(f"{T} values but only {slot_mapping.numel()} slots")
        self._check_slots(slot_mapping[:T], "write")
        if T:
            write_values[(-(-T // TOKENS_PER_PROGRAM),)](slot_mapping, values, self.data, T, self.slot_base,
                                                        BLOCK=TOKENS_PER_PROGRAM)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]], block_slots: int) -> None:
        """Block src's slots over block dst's for every (src, dst), all pairs at once."""
        from blocktable.kernels.kv_oracle import copy_blocks

        if not pairs:
            return
        srcs = {s for s, _ in pairs}
        for _, d in pairs:
            if d in srcs:
                raise ValueError(f"copy_blocks: block {d} is both a source and a destination")
        ids = torch.tensor(pairs, dtype=torch.int64)
        for name, column in (("source", ids[:, 0]), ("destination", ids[:, 1])):
            first = column * block_slots - self.slot_base
            if bool(((first < 0) | (first + block_slots > self.num_slots)).any()):
                raise ValueError(f"copy_blocks: a {name} block lies outside the cache: {pairs}")
        ids = ids.to(self.backend.device)
        src, dst = ids[:, 0].contiguous(), ids[:, 1].contiguous()
        copy_blocks[(len(pairs),)](src, dst, self.data, block_slots, self.slot_base,
                                   BLOCK=min(TOKENS_PER_PROGRAM, 1 << max(0, (block_slots - 1).bit_length())))

    def gather(self, block_table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, *,
               kv_block_size: int, kernel_block_size: int, cp_world_size: int = 1, cp_rank: int = 0,
               cp_interleave: int = 1) -> torch.Tensor:
        """For each i: the value this rank holds for position positions[i] of table row
        rows[i]; POISON where the rank does not hold it, OUT_OF_CACHE where the row
        points outside the cache."""
        from blocktable.kernels.kv_oracle import gather

        check_tensor("block_table", block_table, torch.int32, 2, self.backend)
        check_tensor("rows", rows, torch.int32, 1, self.backend)
        check_tensor("positions", positions, torch.int64, 1, self.backend)
        M = positions.numel()
        if rows.numel() != M:
            raise ValueError(f"{rows.numel()} rows for {M} positions")
        if M and bool(((rows < 0) | (rows >= block_table.shape[0])).any()):
            raise ValueError(f"gather: a row index lies outside the table's {block_table.shape[0]} rows")
        if M and bool((positions < 0).any()):
            raise ValueError("gather: positions must be >= 0")
        out = torch.empty(M, dtype=torch.int64, device=self.backend.device)
        if M:
            gather[(-(-M // TOKENS_PER_PROGRAM),)](
                block_table, block_table.stride(0), block_table.shape[1], rows, positions, self.data, out, M,
                self.slot_base, self.num_slots, kv_block_size, kernel_block_size, cp_world_size, cp_rank,
                cp_interleave, BLOCK=TOKENS_PER_PROGRAM)
        return out

    def values(self) -> np.ndarray:
        return self.data.cpu().numpy()


def poison_value() -> int:
    from blocktable.kernels.kv_oracle import POISON_VALUE

    return POISON_VALUE
