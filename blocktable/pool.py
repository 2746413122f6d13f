"""The ref-counted block pool (docs/contract.md §6), sized for real pools, with §8's
prefix cache when asked for.

Ref counts sit in one int32 array, and the free queue is a ring buffer over an
array as long as the usable blocks: `allocate(n)` takes n ids from the head and
`free` appends to the tail, each O(1) per block, with no list scans. A block can be
queued at most once (it joins only when its ref reaches 0), so the ring never overflows.

With prefix_caching=True a cache hit takes a block out of the middle of the queue,
which a ring cannot do in O(1); the queue is then a doubly-linked list over two
arrays of neighbour ids (vLLM's FreeKVCacheBlockQueue), with head and tail sentinels
after the last block. The cache map is a dict from block hash to (group, prefix
length, insertion-ordered dict of blocks), and each block's hash is kept per block,
so eviction on allocate is O(1) too. With prefix caching off the ring stays: it
moves ids in numpy slices, which the linked list cannot.

`free_order="vllm"` (§6, amended) puts freed blocks that are not cached at the head
instead of the tail: the ring moves its head back over them, the linked queue links
them in after its head sentinel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FREE_ORDERS = ("tail", "vllm")


class BlockPool:
    def __init__(self, num_blocks: int, null_block: bool = True, prefix_caching: bool = False,
                 free_order: str = "tail") -> None:
        first = 1 if null_block else 0
        if not isinstance(num_blocks, int) or num_blocks < first + 1:
            raise ValueError(f"num_blocks must be an int >= {first + 1}, got {num_blocks!r}")
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {', '.join(FREE_ORDERS)}, got {free_order!r}")
        self.free_order = free_order
        self.num_blocks = num_blocks
        self.null_block = null_block
        self.prefix_caching = prefix_caching
        self.ref = np.zeros(num_blocks, dtype=np.int32)
        self._ring = np.arange(first, num_blocks, dtype=np.int64)
        self._head = 0
        self._size = len(self._ring)
        self._next: list[int] | None = None  # the linked queue: prefix caching only
        self._cached: dict[bytes, tuple[int, int, dict[int, None]]] = {}
        if prefix_caching:
            self._link(first)

    def _link(self, first: int) -> None:
        """The linked free queue, every usable block in id order, and an empty cache map."""
        n = self.num_blocks
        self._HEAD, self._TAIL = n, n + 1
        order = [self._HEAD, *range(first, n), self._TAIL]
        self._next = [0] * (n + 2)
        self._prev = [0] * (n + 2)
        for a, b in zip(order, order[1:]):
            self._next[a], self._prev[b] = b, a
        self._hash_of: list[bytes | None] = [None] * n

    @property
    def num_usable(self) -> int:
        return len(self._ring)

    @property
    def num_free(self) -> int:
        return self._size

    def free_queue(self) -> list[int]:
        """The queue, head first (a copy, for reports and comparisons)."""
        if self._next is not None:
            out, b = [], self._next[self._HEAD]
            while b != self._TAIL:
                out.append(b)
                b = self._next[b]
            return out
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
        if self._next is not None:
            return self._pop(n)
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
        if self._next is not None:
            back: list[int] = released.tolist()
            if self.free_order == "vllm":
                self._push_front([b for b in back if self._hash_of[b] is None])
                back = [b for b in back if self._hash_of[b] is not None]
            self._push(back)
            return
        if self.free_order == "vllm":  # nothing is cached: every block goes to the head
            self._head = (self._head - released.size) % len(self._ring)
            at = (self._head + np.arange(released.size)) % len(self._ring)
        else:
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
        state: dict[str, object] = {"ref": self.ref.copy(), "queue": self.free_queue()}
        if self._next is not None:
            state["cache"] = self.cache_listing()
            state["hashes"] = list(self._hash_of)
        return state

    # -- prefix caching (docs/contract.md §8) -------------------------------------------------

    def _pop(self, n: int) -> list[int]:
        """n blocks off the head of the linked queue; a cached one loses its key first."""
        nxt, hash_of = self._next, self._hash_of
        assert nxt is not None  # the linked queue exists exactly when prefix caching is on
        ids = []
        b = nxt[self._HEAD]
        for _ in range(n):
            ids.append(b)
            if hash_of[b] is not None:
                self._evict(b)
            b = nxt[b]
        nxt[self._HEAD], self._prev[b] = b, self._HEAD
        self._size -= n
        self.ref[ids] = 1
        return ids

    def _push(self, ids: list[int]) -> None:
        nxt, prv, tail = self._next, self._prev, self._TAIL
        assert nxt is not None
        for b in ids:
            last = prv[tail]
            nxt[last], prv[b], nxt[b], prv[tail] = b, last, tail, b
        self._size += len(ids)

    def _push_front(self, ids: list[int]) -> None:
        """Link ids in at the head, so that the queue then starts with them in this order."""
        nxt, prv = self._next, self._prev
        assert nxt is not None
        before = self._HEAD
        for b in ids:
            after = nxt[before]
            nxt[before], prv[b], nxt[b], prv[after] = b, before, after, b
            before = b
        self._size += len(ids)

    def _unlink(self, b: int) -> None:
        assert self._next is not None
        before, after = self._prev[b], self._next[b]
        self._next[before], self._prev[after] = after, before
        self._size -= 1

    def _evict(self, b: int) -> None:
        h = self._hash_of[b]
        assert h is not None  # only a cached block is evicted
        blocks = self._cached[h][2]
        del blocks[b]
        if not blocks:
            del self._cached[h]
        self._hash_of[b] = None

    def _need_caching(self, what: str) -> None:
        if self._next is None:
            raise ValueError(f"{what}: prefix caching is off")

    def is_cached(self, block: int) -> bool:
        return self._next is not None and self._hash_of[block] is not None

    def first_cached(self, h: bytes) -> int | None:
        """The block a hit on hash h takes: the first one inserted and still there."""
        entry = self._cached.get(h)
        return None if entry is None else next(iter(entry[2]))

    def cache_block(self, h: bytes, block: int, group: int, length: int) -> None:
        """Insert a block that just became full under the hash of its key (group,
        tokens[0:length]). It is in use and not cached yet."""
        self._need_caching("cache_block")
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"cache_block: block {block} is out of range [0, {self.num_blocks})")
        if self.null_block and block == 0:
            raise ValueError("cache_block: block 0 is the null block")
        if self.ref[block] == 0:
            raise ValueError(f"cache_block: block {block} is free (ref 0): only a block in use is filled")
        if self._hash_of[block] is not None:
            raise ValueError(f"cache_block: block {block} is cached already, under another prefix or this one")
        entry = self._cached.get(h)
        if entry is None:
            entry = self._cached[h] = (group, length, {})
        entry[2][block] = None
        self._hash_of[block] = h

    def touch(self, ids: Sequence[int]) -> None:
        """A lookup's hits, taken by one more table: each block at ref 0 leaves the
        queue from wherever it stands, then each ref rises by one."""
        self._need_caching("touch")
        blocks = self._ids(ids, "touch")
        for b in blocks.tolist():
            if self._hash_of[b] is None:
                raise ValueError(f"touch: block {b} is not cached; only a lookup's hits are touched")
        for b in blocks[self.ref[blocks] == 0].tolist():
            self._unlink(b)
        self.ref[blocks] += 1

    def reset_prefix_cache(self) -> bool:
        """Drop every key and return True when every non-null block is at ref 0 (then
        all of them are queued); else return False and change nothing."""
        if self._size != self.num_usable:
            return False
        if self._next is not None:
            self._cached.clear()
            self._hash_of = [None] * self.num_blocks
        return True

    def cache_entries(self) -> list[tuple[bytes, list[int]]]:
        """(hash, blocks) per key, in insertion order."""
        return [(h, list(entry[2])) for h, entry in self._cached.items()]

    def cache_listing(self) -> list[tuple[int, int, list[int]]]:
        """(group, prefix length in tokens, blocks) per key, keys and blocks in insertion
        order: the cache map without the hashes, comparable with the reference's."""
        if self._next is None:
            return []
        return [(group, length, list(blocks)) for group, length, blocks in self._cached.values()]
