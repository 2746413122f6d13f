"""docs/contract.md §6: the ref-counted block pool with its FIFO free queue, and §8's
prefix cache map on top of it (prefix_caching=True).

Blocks are 0 .. num_blocks-1. With null_block=True block 0 is reserved: never
allocated, never freed, never queued. The queue is a plain list, scanned and
sliced; the implementation's queue is O(1) and must hand out the same ids.

Where a freed block goes is the pool's `free_order` (§6, amended): "tail" puts every
block reaching ref 0 at the tail; "vllm" (vLLM v1 since #51482) puts the uncached
ones at the head, the head then reading them in the order given, and the cached ones
at the tail.

The cache map is a dict from key to a list of blocks: the dict keeps keys in
insertion order, and a list that never holds a block twice is an insertion-ordered
set. Which key a block is under is found by scanning the map.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from blocktable.reference.keys import Key


class InvariantError(AssertionError):
    """A docs/contract.md §6 (or §8) invariant does not hold. `invariant` names which, `block` the block."""

    def __init__(self, invariant: str, block: int | None, message: str) -> None:
        super().__init__(message)
        self.invariant = invariant
        self.block = block


def _as_ids(ids: Iterable[int], what: str) -> list[int]:
    out = []
    for b in ids:
        if not isinstance(b, (int, np.integer)) or isinstance(b, bool):
            raise TypeError(f"{what}: block id must be an int, got {type(b).__name__} {b!r}")
        out.append(int(b))
    return out


FREE_ORDERS = ("tail", "vllm")


class BlockPool:
    def __init__(self, num_blocks: int, null_block: bool = True, prefix_caching: bool = False,
                 free_order: str = "tail") -> None:
        if type(num_blocks) is not int or num_blocks < (2 if null_block else 1):
            raise ValueError(f"num_blocks must be an int >= {2 if null_block else 1}, got {num_blocks!r}")
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {', '.join(FREE_ORDERS)}, got {free_order!r}")
        self.free_order = free_order
        self.num_blocks = num_blocks
        self.null_block = null_block
        self.ref = np.zeros(num_blocks, dtype=np.int64)  # per block: how many live tables hold it
        first = 1 if null_block else 0
        self.queue: list[int] = list(range(first, num_blocks))  # the free queue, head first
        self.prefix_caching = prefix_caching
        self.cached: dict[Key, list[int]] = {}  # docs/contract.md §8's cache map; empty when off

    @property
    def num_usable(self) -> int:
        """Non-null blocks: the ones that can ever be handed out."""
        return self.num_blocks - (1 if self.null_block else 0)

    @property
    def num_free(self) -> int:
        return len(self.queue)

    def free_queue(self) -> list[int]:
        """The free queue, head first (a copy)."""
        return list(self.queue)

    def _check_id(self, b: int, what: str) -> None:
        if not 0 <= b < self.num_blocks:
            raise ValueError(f"{what}: block {b} is out of range [0, {self.num_blocks})")
        if self.null_block and b == 0:
            raise ValueError(f"{what}: block 0 is the null block")

    def allocate(self, n: int) -> list[int]:
        """Pop n blocks from the head of the queue, each at ref 1."""
        if type(n) is not int or n < 0:
            raise ValueError(f"allocate needs a count >= 0, got {n!r}")
        if n > len(self.queue):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self.queue)} are free")
        ids = self.queue[:n]
        del self.queue[:n]
        for b in ids:
            # docs/contract.md §8's eviction: a popped block loses its key before it is handed out.
            key = self.block_key(b)
            if key is not None:
                self.cached[key].remove(b)
                if not self.cached[key]:
                    del self.cached[key]
            self.ref[b] = 1
        return ids

    def _distinct_ids(self, ids: Sequence[int], what: str) -> list[int]:
        """The ids of one call, checked one by one: each an int in the pool, not the
        null block, not listed twice."""
        ids = _as_ids(ids, what)
        seen: set[int] = set()
        for b in ids:
            self._check_id(b, what)
            if b in seen:
                raise ValueError(f"{what}: block {b} is listed twice in one call")
            seen.add(b)
        return ids

    def _blocks_in_use(self, ids: Sequence[int], what: str, if_free: str) -> list[int]:
        """The ids of a free or share call: distinct, and each in use (else `if_free`)."""
        ids = self._distinct_ids(ids, what)
        for b in ids:
            if self.ref[b] == 0:
                raise ValueError(f"{what}: {if_free.format(b=b)}")
        return ids

    def free(self, ids: Sequence[int]) -> None:
        """Release one request's blocks, given last block first. Each ref drops by one.
        Blocks reaching 0 join the queue in the order given: at the tail, or with
        free_order="vllm" the uncached ones at the head (so the next allocation takes
        the first of them first) and the cached ones at the tail."""
        ids = self._blocks_in_use(ids, "free", "double free of block {b} (its ref is already 0)")
        released = []
        for b in ids:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                released.append(b)
        if self.free_order == "tail":
            self.queue.extend(released)
            return
        uncached = [b for b in released if not self.is_cached(b)]
        self.queue[:0] = uncached
        self.queue.extend(b for b in released if self.is_cached(b))

    def share(self, ids: Sequence[int]) -> None:
        """Fork: one more table holds each of these blocks. Ids must be distinct and in use."""
        ids = self._blocks_in_use(ids, "share", "block {b} is free (ref 0) and cannot be shared")
        for b in ids:
            self.ref[b] += 1

    # -- docs/contract.md §8: the prefix cache ----------------------------------------------

    def _need_caching(self, what: str) -> None:
        if not self.prefix_caching:
            raise ValueError(f"{what}: prefix caching is off")

    def block_key(self, b: int) -> Key | None:
        """The key block b is cached under, or None."""
        for key, blocks in self.cached.items():
            if b in blocks:
                return key
        return None

    def is_cached(self, b: int) -> bool:
        return self.block_key(b) is not None

    def first_cached(self, key: Key) -> int | None:
        """The block a hit on `key` takes: the first one inserted and still there."""
        blocks = self.cached.get(key)
        return blocks[0] if blocks else None

    def cache_block(self, key: Key, b: int) -> None:
        """Insert a block that just became full under its key. It is in use (a table is
        filling it) and not cached yet: a block's key never changes while it is cached."""
        self._need_caching("cache_block")
        [b] = self._blocks_in_use([b], "cache_block", "block {b} is free (ref 0): only a block in use is filled")
        if self.is_cached(b):
            raise ValueError(f"cache_block: block {b} is cached already, under another prefix or this one")
        self.cached.setdefault(key, []).append(b)

    def touch(self, ids: Sequence[int]) -> None:
        """A lookup's hits, taken by one more table. Each block at ref 0 leaves the free
        queue from wherever it stands; then each ref rises by one."""
        self._need_caching("touch")
        ids = self._distinct_ids(ids, "touch")
        for b in ids:
            if not self.is_cached(b):
                raise ValueError(f"touch: block {b} is not cached; only a lookup's hits are touched")
        for b in ids:
            if self.ref[b] == 0:
                self.queue.remove(b)
        for b in ids:
            self.ref[b] += 1

    def reset_prefix_cache(self) -> bool:
        """Drop every key and return True when every non-null block is at ref 0; else
        return False and change nothing."""
        first = 1 if self.null_block else 0
        if any(self.ref[b] > 0 for b in range(first, self.num_blocks)):
            return False
        self.cached.clear()
        return True

    def cache_listing(self) -> list[tuple[int, int, list[int]]]:
        """The cache map in a form both sides can give: (group, prefix length in tokens,
        blocks) per key, keys and blocks in insertion order."""
        return [(group, len(prefix), list(blocks)) for (group, prefix), blocks in self.cached.items()]

    # -- invariants ------------------------------------------------------------------

    def check_invariants(self, tables: Iterable[Sequence[int]]) -> None:
        """Raise InvariantError naming the first broken docs/contract.md §6 invariant and its block,
        then §8's invariants on the cache map. `tables` are the block lists of every live
        table (the tables' side of §8 is SequenceBlocks.check_cache_keys).

        docs/contract.md §6's fourth invariant, free count + blocks in use = non-null blocks, is
        not checked on its own: once no block is queued twice, it says exactly what
        "queued iff ref is 0" says for every block, and that check names the block.
        """
        tables = [list(table) for table in tables]
        ids = np.array([b for table in tables for b in table], dtype=np.int64)
        outside = (ids < 0) | (ids >= self.num_blocks)
        if outside.any():
            b = int(ids[outside][0])
            raise InvariantError("id-range", b, f"a live table holds block {b}, outside the pool")
        # Holders count tables, not entries: each table's distinct blocks once.
        distinct = np.array([b for table in tables for b in set(table)], dtype=np.int64)
        holders = np.bincount(distinct, minlength=self.num_blocks)
        queue = np.asarray(self.queue, dtype=np.int64)
        outside = (queue < 0) | (queue >= self.num_blocks)
        if outside.any():
            b = int(queue[outside][0])
            raise InvariantError("id-range", b, f"the free queue holds block {b}, outside the pool")
        queued = np.bincount(queue, minlength=self.num_blocks)
        ref = np.asarray(self.ref, dtype=np.int64)
        if self.null_block and (queued[0] or ref[0] or holders[0]):
            raise InvariantError("null-block", 0,
                                 f"block 0 is the null block but has ref {ref[0]}, "
                                 f"is queued {queued[0]} times and held by {holders[0]} tables")
        first = 1 if self.null_block else 0
        # The three per-block invariants, each as a boolean per block; the first
        # block that breaks any of them is reported, with the first one it breaks.
        broken = {
            "queued-once": queued > 1,
            "queued-iff-free": (queued == 1) != (ref == 0),
            "ref-equals-holders": ref != holders,
        }
        for mask in broken.values():
            mask[:first] = False
        bad = np.flatnonzero(np.logical_or.reduce(list(broken.values())))
        if not len(bad):
            self._check_cache_invariants()
            return
        b = int(bad[0])
        if broken["queued-once"][b]:
            raise InvariantError("queued-once", b, f"block {b} is in the free queue {queued[b]} times")
        if broken["queued-iff-free"][b]:
            raise InvariantError("queued-iff-free", b,
                                 f"block {b} has ref {ref[b]} but is "
                                 f"{'in' if queued[b] else 'not in'} the free queue")
        raise InvariantError("ref-equals-holders", b,
                             f"block {b} has ref {ref[b]} but {holders[b]} live tables hold it")

    def _check_cache_invariants(self) -> None:
        """docs/contract.md §8's invariants on the map alone: no key without blocks, every key's
        blocks distinct and each in use or in the free queue, no block under two keys.
        Run after §6's, which make "in use or queued" mean "a non-null block of the
        pool"."""
        under: dict[int, Key] = {}
        for key, blocks in self.cached.items():
            where = f"the key of group {key[0]} over {len(key[1])} tokens"
            if not blocks:
                raise InvariantError("cache-key-empty", None, f"{where} has no blocks (it should have gone)")
            for b in blocks:
                if type(b) is not int or not 0 <= b < self.num_blocks or (self.null_block and b == 0):
                    raise InvariantError("cache-block-lost", b if type(b) is int else None,
                                         f"{where} holds block {b!r}, neither in use nor in the free queue")
                if b in under:
                    other = under[b]
                    same = "twice" if other == key else f"and also under the key of group {other[0]} over " \
                                                        f"{len(other[1])} tokens"
                    raise InvariantError("cached-once", b, f"block {b} is under {where} {same}")
                under[b] = key
