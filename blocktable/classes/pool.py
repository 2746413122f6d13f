"""Our BlockPool (blocktable/pool.py) through docs/contract.md §11's pool protocol.

The protocol's `touch` is both a prefix hit's touch and a fork's sharing: blocks at
ref 0 are revived (our pool's `touch`, which only a cached block allows), blocks in
use gain a holder (`share`). Keys are opaque to the protocol: our pool keeps them as
its cache map's keys, with no group or length of its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from blocktable.pool import BlockPool


class Pool:
    free_orders = ("tail", "vllm")

    def __init__(self, *, num_blocks: int, null_block: bool, prefix_caching: bool, free_order: str) -> None:
        self._pool = BlockPool(num_blocks, null_block, prefix_caching=prefix_caching, free_order=free_order)

    def allocate(self, n: int) -> list[int]:
        return self._pool.allocate(n)

    def free(self, ids: Sequence[int]) -> None:
        self._pool.free(ids)

    def touch(self, ids: Sequence[int]) -> None:
        blocks = self._pool._ids(ids, "touch")  # checked whole before anything changes
        revived = [b for b in blocks.tolist() if self._pool.ref[b] == 0]
        held = [b for b in blocks.tolist() if self._pool.ref[b] > 0]
        if revived:
            self._pool.touch(revived)
        if held:
            self._pool.share(held)

    def cache(self, block: int, key: Hashable) -> None:
        self._pool.cache_block(key, block, 0, 0)  # type: ignore[arg-type]  # any hashable key works

    def lookup(self, key: Hashable) -> int | None:
        return self._pool.first_cached(key)  # type: ignore[arg-type]

    def reset_prefix_cache(self) -> bool:
        return self._pool.reset_prefix_cache()

    def num_free(self) -> int:
        return self._pool.num_free

    def free_queue(self) -> list[int]:
        return self._pool.free_queue()

    def ref(self, block: int) -> int:
        return int(self._pool.ref[block])

    def cache_map(self) -> Sequence[tuple[Hashable, list[int]]]:
        return list(self._pool.cache_entries())
