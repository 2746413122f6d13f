"""The ref-counted block pool (docs/contract.md §6), sized for real pools.

Ref counts sit in one int32 array, and the free queue is a ring buffer over an
array as long as the usable blocks: `allocate(n)` takes n ids from the head and
`free` appends to the tail, each O(1) per block, with no list scans. A block can be
queued at most once (it joins only when its ref reaches 0), so the ring never overflows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int, null_block: bool = True) -> None:
        first = 1 if null_block else 0
        if not isinstance(num_blocks, int) or num_blocks < first + 1:
            raise ValueError(f"num_blocks must be an int >= {first + 1}, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.null_block = null_block
        self.ref = np.zeros(num_blocks, dtype=np.int32)
        self._ring = np.arange(first, num_blocks, dtype=np.int64)
        self._head = 0
        self._size = len(self._ring)

    @property
    def num_usable(self) -> int:
        return len(self._ring)

    @property
    def num_free(self) -> int:
        return self._size

    def free_queue(self) -> list[int]:
        """The queue, head first (a copy, for reports and comparisons)."""
        end = self._head + self._size
        if end <= len(self._ring):
            return self._ring[self._head:end].tolist()
        return self._ring[self._head:].tolist() + self._ring[:end - len(self._ring)].tolist()

    def _ids(self, ids: Sequence[int], what: str) -> np.ndarray:
        blocks = np.asarray(ids)
        if blocks.size == 0:
            return np.zeros(0, dtype=np.int64)
        if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
            raise TypeError(f"{what}: block ids must be ints, got {blocks.dtype}")
        blocks = blocks.astype(np.int64)
        outside = (blocks < 0) | (blocks >= self.num_blocks)
        if outside.any():
            raise ValueError(f"{what}: block {int(blocks[np.argmax(outside)])} is out of range [0, {self.num_blocks})")
        if self.null_block and (blocks == 0).any():
            raise ValueError(f"{what}: block 0 is the null block")
        unique, counts = np.unique(blocks, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"{what}: block {int(unique[np.argmax(counts > 1)])} is listed twice in one call")
        return blocks

    def allocate(self, n: int) -> list[int]:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"allocate needs a count >= 0, got {n!r}")
        if n > self._size:
            raise ValueError(f"cannot allocate {n} blocks: only {self._size} are free")
        at = (self._head + np.arange(n)) % len(self._ring)
        ids = self._ring[at]
        self._head = (self._head + n) % len(self._ring)
        self._size -= n
        self.ref[ids] = 1
        return ids.tolist()

    def free(self, ids: Sequence[int]) -> None:
        """One request's blocks, last block first. Blocks reaching ref 0 join the tail
        in the order given."""
        blocks = self._ids(ids, "free")
        zero = self.ref[blocks] == 0
        if zero.any():
            raise ValueError(f"free: double free of block {int(blocks[np.argmax(zero)])} (its ref is already 0)")
        self.ref[blocks] -= 1
        released = blocks[self.ref[blocks] == 0]
        at = (self._head + self._size + np.arange(released.size)) % len(self._ring)
        self._ring[at] = released
        self._size += released.size

    def share(self, ids: Sequence[int]) -> None:
        """One more table holds each block (fork). Distinct ids, each in use."""
        blocks = self._ids(ids, "share")
        zero = self.ref[blocks] == 0
        if zero.any():
            raise ValueError(f"share: block {int(blocks[np.argmax(zero)])} is free (ref 0) and cannot be shared")
        self.ref[blocks] += 1

    def unshare(self, block: int) -> None:
        """A writer stops sharing a block it copied away from (copy-on-write)."""
        if self.ref[block] < 2:
            raise ValueError(f"unshare: block {block} has ref {int(self.ref[block])}; only a shared block is copied")
        self.ref[block] -= 1

    def state_snapshot(self) -> dict[str, object]:
        return {"ref": self.ref.copy(), "queue": self.free_queue()}
