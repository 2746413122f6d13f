"""A block pool class written against blocktable's pool protocol (docs/plugins.md,
"Class plug-ins"): ref counts, a free queue and a prefix-cache map, in plain Python.
It follows both free orders of docs/contract.md §6.

    blocktable fuzz --pool examples/pool_class.py:ListPool --minutes 1

It is kept short, not fast: the queue is a list, scanned where a block leaves it.
"""

from __future__ import annotations


class ListPool:
    free_orders = ("tail", "vllm")

    def __init__(self, *, num_blocks, null_block, prefix_caching, free_order):
        self.null_block = null_block
        self.prefix_caching = prefix_caching
        self.free_order = free_order
        self.refs = [0] * num_blocks
        self.queue = list(range(1 if null_block else 0, num_blocks))  # head first
        self.cached = {}  # key -> its blocks, in the order they were cached
        self.key_of = {}  # block -> the key it is cached under

    def _check(self, ids, need_in_use):
        if len(set(ids)) != len(ids):
            raise ValueError(f"a block is listed twice in {list(ids)}")
        for b in ids:
            if not 0 <= b < len(self.refs) or (self.null_block and b == 0):
                raise ValueError(f"block {b} is not a block of this pool")
            if need_in_use and self.refs[b] == 0:
                raise ValueError(f"block {b} is free (ref 0)")

    def allocate(self, n):
        if n > len(self.queue):
            raise ValueError(f"cannot allocate {n} blocks: {len(self.queue)} are free")
        taken, self.queue = self.queue[:n], self.queue[n:]
        for b in taken:
            if b in self.key_of:  # evicted: it leaves its key before it is handed out
                key = self.key_of.pop(b)
                self.cached[key].remove(b)
                if not self.cached[key]:
                    del self.cached[key]
            self.refs[b] = 1
        return taken

    def free(self, ids):
        self._check(ids, need_in_use=True)
        released = []
        for b in ids:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                released.append(b)
        if self.free_order == "vllm":
            self.queue[:0] = [b for b in released if b not in self.key_of]
            self.queue += [b for b in released if b in self.key_of]
        else:
            self.queue += released

    def touch(self, ids):
        self._check(ids, need_in_use=False)
        for b in ids:
            if self.refs[b] == 0:
                if b not in self.key_of:
                    raise ValueError(f"block {b} is free and not cached: there is nothing to revive")
                self.queue.remove(b)
            self.refs[b] += 1

    def cache(self, block, key):
        if not self.prefix_caching:
            raise ValueError("prefix caching is off")
        if block in self.key_of:
            raise ValueError(f"block {block} is cached already")
        self.cached.setdefault(key, []).append(block)
        self.key_of[block] = key

    def lookup(self, key):
        blocks = self.cached.get(key)
        return blocks[0] if blocks else None

    def reset_prefix_cache(self):
        if any(self.refs):
            return False
        self.cached.clear()
        self.key_of.clear()
        return True

    def num_free(self):
        return len(self.queue)

    def free_queue(self):
        return list(self.queue)

    def ref(self, block):
        return self.refs[block]

    def cache_map(self):
        return [(key, list(blocks)) for key, blocks in self.cached.items()]
