"""docs/contract.md §3: one KV-cache group's block table, row by row, host and committed copy.

The host buffer is `(max_num_reqs, width)` int32 plus `count[r]`, the number of
filled entries of row r. `device` is what the last `commit` left on the device:
it changes only in `commit`, `clear` and CUDA-graph padding. Whole buffers are the
contract: entries past a row's count (its stale tail) are compared too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from blocktable.reference.layout import INT32_MAX, NULL_BLOCK_ID, GroupLayout, map_to_kernel_blocks


class BlockTable:
    def __init__(self, max_num_reqs: int, max_model_len: int, layout: GroupLayout) -> None:
        if type(max_num_reqs) is not int or max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be a positive int, got {max_num_reqs!r}")
        self.layout = layout
        self.max_num_reqs = max_num_reqs
        self.width = layout.row_width(max_model_len)
        self.host = np.zeros((max_num_reqs, self.width), dtype=np.int32)
        self.count = np.zeros(max_num_reqs, dtype=np.int32)
        self.device = np.zeros((max_num_reqs, self.width), dtype=np.int32)

    # -- checks (each raises before anything changes) --------------------------------

    def _check_row(self, r: int, name: str = "row") -> int:
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool):
            raise TypeError(f"{name} must be an int, got {type(r).__name__} {r!r}")
        if not 0 <= r < self.max_num_reqs:
            raise ValueError(f"{name} {r} is out of range [0, {self.max_num_reqs})")
        return int(r)

    def expand(self, ids: Sequence[int]) -> list[int]:
        """Validate allocation block ids and map them to kernel block ids."""
        P = self.layout.kernel_blocks_per_block
        checked = []
        for b in ids:
            if not isinstance(b, (int, np.integer)) or isinstance(b, bool):
                raise TypeError(f"block id must be an int, got {type(b).__name__} {b!r}")
            if b < 0 or int(b) * P + P - 1 > INT32_MAX:
                raise ValueError(f"block id {b} does not fit: kernel ids b*{P}..b*{P}+{P - 1} must lie in [0, 2**31-1]")
            checked.append(int(b))
        return map_to_kernel_blocks(checked, P)

    def check_append(self, ids: Sequence[int], r: int) -> list[int]:
        """Validate an append of `ids` to row r; return the kernel ids to write."""
        r = self._check_row(r)
        kernel_ids = self.expand(ids)
        start = int(self.count[r])
        if start + len(kernel_ids) > self.width:
            raise ValueError(
                f"row {r} overflows: it holds {start} entries, appending {len(kernel_ids)} "
                f"kernel blocks ({len(ids)} allocation blocks) exceeds width {self.width}")
        return kernel_ids

    # -- row operations ------------------------------------------------------------

    def append_row(self, ids: Sequence[int], r: int) -> None:
        """Expand, write at count[r], add to count[r]. Empty ids: no-op. Overflow: error, no change."""
        kernel_ids = self.check_append(ids, r)
        if not kernel_ids:
            return
        start = int(self.count[r])
        for j, k in enumerate(kernel_ids):
            self.host[r, start + j] = k
        self.count[r] = start + len(kernel_ids)

    def add_row(self, ids: Sequence[int], r: int) -> None:
        """count[r] = 0, then append. Entries past the new count keep what they held."""
        r = self._check_row(r)
        kernel_ids = self.expand(ids)
        if len(kernel_ids) > self.width:
            raise ValueError(f"row {r} overflows: {len(kernel_ids)} kernel blocks exceed width {self.width}")
        self.count[r] = 0
        self.append_row(ids, r)

    def clear_row(self, r: int) -> None:
        """Zero [:count[r]], then count[r] = 0."""
        r = self._check_row(r)
        n = int(self.count[r])
        for j in range(n):
            self.host[r, j] = 0
        self.count[r] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Copy [:count[src]] and the count to dst, then clear src's filled part.
        dst's tail past the count keeps what it held; move_row(a, a) is a no-op."""
        src = self._check_row(src, "src")
        dst = self._check_row(dst, "dst")
        if src == dst:
            return
        n = int(self.count[src])
        for j in range(n):
            self.host[dst, j] = self.host[src, j]
        self.count[dst] = n
        for j in range(n):
            self.host[src, j] = 0
        self.count[src] = 0

    def swap_row(self, a: int, b: int) -> None:
        """Swap whole rows (all `width` entries) and counts; swap_row(a, a) is a no-op."""
        a = self._check_row(a, "a")
        b = self._check_row(b, "b")
        if a == b:
            return
        row_a = self.host[a].copy()
        self.host[a] = self.host[b]
        self.host[b] = row_a
        self.count[a], self.count[b] = self.count[b], self.count[a]

    def commit(self, n: int) -> None:
        """Device rows [:n] become a snapshot of host rows [:n]; rows >= n untouched."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise TypeError(f"commit count must be an int, got {type(n).__name__} {n!r}")
        if not 0 <= n <= self.max_num_reqs:
            raise ValueError(f"commit count {n} is out of range [0, {self.max_num_reqs}]")
        self.device[:n] = self.host[:n].copy()

    def clear(self) -> None:
        """Both copies all zero (counts too)."""
        self.host[:] = 0
        self.count[:] = 0
        self.device[:] = 0

    # -- docs/contract.md §5 --------------------------------------------------------------------

    def pad_for_cuda_graph(self, num_reqs: int, num_reqs_padded: int) -> np.ndarray:
        """Device rows [num_reqs:num_reqs_padded] become NULL_BLOCK_ID, in place (a
        captured graph reads the persistent buffer); return device rows [:num_reqs_padded]."""
        if not 0 <= num_reqs <= num_reqs_padded <= self.max_num_reqs:
            raise ValueError(
                f"padding needs 0 <= num_reqs ({num_reqs}) <= num_reqs_padded ({num_reqs_padded}) "
                f"<= max_num_reqs ({self.max_num_reqs})")
        self.device[num_reqs:num_reqs_padded] = NULL_BLOCK_ID
        return self.device[:num_reqs_padded].copy()

    def row(self, r: int) -> list[int]:
        """The filled part of host row r."""
        r = self._check_row(r)
        return [int(x) for x in self.host[r, : self.count[r]]]
