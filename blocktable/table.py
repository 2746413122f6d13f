"""The device-backed block table of one KV-cache group (docs/contract.md §2, §3, §5).

Host rows live in a CPU tensor (pinned when a GPU is used) seen through a numpy
view, so row edits are plain numpy; nothing reaches the device until `commit(n)`,
which sends rows [:n] in one host-to-device copy. The copy goes through a pinned
staging buffer guarded by an event, so a host edit made right after `commit`
cannot leak into the transfer still in flight: the device receives a snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from blocktable.checks import check_config
from blocktable.device import Backend, current

NULL_BLOCK_ID = 0
INT32_MAX = 2**31 - 1


def _index(name: str, value: object, limit: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= value < limit:
        raise ValueError(f"{name} {value} is out of range [0, {limit})")
    return int(value)


class BlockTable:
    def __init__(self, max_num_reqs: int, max_model_len: int, *, kv_block_size: int, kernel_block_size: int,
                 sharded: bool = True, cp_world_size: int = 1, cp_interleave: int = 1,
                 backend: Backend | None = None) -> None:
        check_config(kv_block_size, kernel_block_size, cp_world_size, 0, cp_interleave)
        if not isinstance(max_num_reqs, int) or max_num_reqs < 1:
            raise ValueError(f"max_num_reqs must be a positive int, got {max_num_reqs!r}")
        if not isinstance(max_model_len, int) or max_model_len < 1:
            raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
        self.backend = backend or current()
        self.kv_block_size = kv_block_size
        self.kernel_block_size = kernel_block_size
        self.sharded = sharded
        self.cp_world_size = cp_world_size if sharded else 1
        self.cp_interleave = cp_interleave if sharded else 1
        self.kernel_blocks_per_block = kv_block_size // kernel_block_size
        self.max_num_reqs = max_num_reqs
        blocks = -(-max_model_len // (kv_block_size * self.cp_world_size))
        align = 128 // math.gcd(128, kv_block_size)  # vLLM's rule (docs/contract.md §2)
        self.width = -(-blocks // align) * align * self.kernel_blocks_per_block

        on_gpu = self.backend.name == "cuda"
        shape = (max_num_reqs, self.width)
        self._host = torch.zeros(shape, dtype=torch.int32, pin_memory=on_gpu)
        self.host = self._host.numpy()  # shares memory with _host
        self.count = np.zeros(max_num_reqs, dtype=np.int32)
        self.device_tensor = torch.zeros(shape, dtype=torch.int32, device=self.backend.device)
        self._staging = torch.zeros(shape, dtype=torch.int32, pin_memory=True) if on_gpu else None
        self._sent = torch.cuda.Event() if on_gpu else None

    # -- checks -------------------------------------------------------------------------

    def row_index(self, r: object, name: str = "row") -> int:
        return _index(name, r, self.max_num_reqs)

    def kernel_ids(self, ids: Sequence[int]) -> np.ndarray:
        """Allocation block ids -> kernel block ids (b*P .. b*P+P-1 each), checked."""
        blocks = np.asarray(ids)
        if blocks.size == 0:
            return np.zeros(0, dtype=np.int32)
        if blocks.ndim != 1 or blocks.dtype.kind not in "iu":
            raise TypeError(f"block ids must be a flat sequence of ints, got {blocks.dtype} {list(ids)[:4]!r}")
        P = self.kernel_blocks_per_block
        too_big = (INT32_MAX - (P - 1)) // P
        bad = (blocks < 0) | (blocks > too_big)
        if bad.any():
            b = int(blocks[np.argmax(bad)])
            raise ValueError(f"block id {b} does not fit: kernel ids b*{P}..b*{P}+{P - 1} must lie in [0, 2**31-1]")
        return (blocks.astype(np.int64)[:, None] * P + np.arange(P)).reshape(-1).astype(np.int32)

    def check_append(self, ids: Sequence[int], r: object) -> tuple[int, np.ndarray]:
        r = self.row_index(r)
        kernel = self.kernel_ids(ids)
        have = int(self.count[r])
        if have + kernel.size > self.width:
            raise ValueError(f"row {r} overflows: it holds {have} entries, appending {kernel.size} kernel "
                             f"blocks ({len(ids)} allocation blocks) exceeds width {self.width}")
        return r, kernel

    # -- row operations (host only) ------------------------------------------------------

    def append_row(self, ids: Sequence[int], r: int) -> None:
        r, kernel = self.check_append(ids, r)
        have = int(self.count[r])
        self.host[r, have:have + kernel.size] = kernel
        self.count[r] = have + kernel.size

    def add_row(self, ids: Sequence[int], r: int) -> None:
        r = self.row_index(r)
        kernel = self.kernel_ids(ids)
        if kernel.size > self.width:
            raise ValueError(f"row {r} overflows: {kernel.size} kernel blocks exceed width {self.width}")
        self.host[r, :kernel.size] = kernel
        self.count[r] = kernel.size

    def clear_row(self, r: int) -> None:
        r = self.row_index(r)
        self.host[r, :self.count[r]] = 0
        self.count[r] = 0

    def move_row(self, src: int, dst: int) -> None:
        src, dst = self.row_index(src, "src"), self.row_index(dst, "dst")
        if src == dst:
            return
        n = int(self.count[src])
        self.host[dst, :n] = self.host[src, :n]
        self.count[dst] = n
        self.host[src, :n] = 0
        self.count[src] = 0

    def swap_row(self, a: int, b: int) -> None:
        a, b = self.row_index(a, "a"), self.row_index(b, "b")
        if a == b:
            return
        self.host[[a, b]] = self.host[[b, a]]
        self.count[[a, b]] = self.count[[b, a]]

    # -- device side -------------------------------------------------------------------

    def commit(self, n: int) -> None:
        """Device rows [:n] become a snapshot of host rows [:n]; rows >= n untouched."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise TypeError(f"commit count must be an int, got {type(n).__name__} {n!r}")
        if not 0 <= n <= self.max_num_reqs:
            raise ValueError(f"commit count {n} is out of range [0, {self.max_num_reqs}]")
        if n == 0:
            return
        if self._staging is None:
            self.device_tensor[:n].copy_(self._host[:n])
            return
        assert self._sent is not None  # made with the staging buffer
        self._sent.synchronize()  # the previous transfer has finished reading the staging buffer
        self._staging[:n].copy_(self._host[:n])
        self.device_tensor[:n].copy_(self._staging[:n], non_blocking=True)
        self._sent.record()

    def clear(self) -> None:
        self.host.fill(0)
        self.count.fill(0)
        self.device_tensor.zero_()

    def pad_for_cuda_graph(self, num_reqs: int, num_reqs_padded: int) -> torch.Tensor:
        """Rows [num_reqs:num_reqs_padded] of the device table become NULL_BLOCK_ID in
        place (a captured graph reads the persistent buffer); returns rows [:num_reqs_padded]."""
        if not 0 <= num_reqs <= num_reqs_padded <= self.max_num_reqs:
            raise ValueError(f"padding needs 0 <= num_reqs ({num_reqs}) <= num_reqs_padded ({num_reqs_padded}) "
                             f"<= max_num_reqs ({self.max_num_reqs})")
        self.device_tensor[num_reqs:num_reqs_padded].fill_(NULL_BLOCK_ID)
        return self.device_tensor[:num_reqs_padded]

    def device_rows(self) -> np.ndarray:
        """The whole device buffer, copied back (synchronises)."""
        return self.device_tensor.cpu().numpy()

    def state_snapshot(self) -> dict[str, np.ndarray]:
        return {"host": self.host.copy(), "count": self.count.copy(), "device": self.device_rows().copy()}
