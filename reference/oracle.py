"""docs/contract.md §7, the device's side of the data-level oracle, modelled: one rank's paged
KV cache as a flat int64 array of slots holding one value per token.

It models the three oracle kernels (write through a slot mapping, copy blocks for
copy-on-write pairs, gather a sequence back through its row) so that those kernels
can be proven equal to it, whole buffer included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from blocktable.reference.slot import slot_of_position

POISON = -(2**62)  # never a value the oracle writes: an unwritten slot shows as this


class PagedCache:
    def __init__(self, num_slots: int, slot_base: int = 0) -> None:
        """Slots slot_base .. slot_base + num_slots - 1 (a base lets block ids near
        2**31-1 index a small cache)."""
        self.slot_base = slot_base
        self.data = np.full(num_slots, POISON, dtype=np.int64)

    def _index(self, slot: int) -> int:
        i = slot - self.slot_base
        if not 0 <= i < len(self.data):
            raise IndexError(f"slot {slot} lies outside the cache [{self.slot_base}, "
                             f"{self.slot_base + len(self.data)})")
        return i

    def write(self, slot_mapping: np.ndarray, values: np.ndarray) -> None:
        """For each token t < len(values): slot s = slot_mapping[t]; skip s < 0. Two
        tokens may not share a slot in one call (on a device their writes race)."""
        used = [int(s) for s in slot_mapping[:len(values)] if s >= 0]
        if len(used) != len(set(used)):
            twice = next(s for s in used if used.count(s) > 1)
            raise ValueError(f"write: slot {twice} is written by more than one token in one call")
        for t in range(len(values)):
            s = int(slot_mapping[t])
            if s >= 0:
                self.data[self._index(s)] = values[t]

    def copy_blocks(self, pairs: Sequence[tuple[int, int]], block_slots: int) -> None:
        """Copy block src's slots over block dst's, for every (src, dst). The device
        copies every pair at once, so no dst may also be a src in the same call."""
        srcs = {src for src, _ in pairs}
        for _, dst in pairs:
            if dst in srcs:
                raise ValueError(f"copy_blocks: block {dst} is both a source and a destination")
        for src, dst in pairs:
            s = self._index(src * block_slots)
            d = self._index(dst * block_slots)
            self.data[d:d + block_slots] = self.data[s:s + block_slots]

    def gather(self, row: np.ndarray, num_tokens: int, *, kv_block_size: int, kernel_block_size: int,
               cp_world_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1) -> np.ndarray:
        """Read positions 0 .. num_tokens-1 of one sequence through its table row;
        POISON where this rank does not own the position."""
        out = np.full(num_tokens, POISON, dtype=np.int64)
        for p in range(num_tokens):
            s = slot_of_position(p, row, kv_block_size=kv_block_size, kernel_block_size=kernel_block_size,
                                 cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave)
            if s >= 0:
                out[p] = self.data[self._index(s)]
        return out
