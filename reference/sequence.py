"""docs/contract.md §6: one KV-cache group's per-sequence block lists on top of a pool.

This is where fork (beam search), copy-on-write and preempt/resume live. A block id
covers `tokens_per_block` tokens: K for a replicated group, K * W for a sharded one
(every DCP rank keeps its own K of them under the same id).

With prefix caching on the pool (docs/contract.md §8) every call that gives slots to
tokens takes their ids, and every block that becomes full goes into the pool's
cache map under its key. A lookup's hits come in through `add(..., computed=L)`;
`blocktable.reference.prefix` runs the lookup across groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from blocktable.reference.keys import block_key, token_ids
from blocktable.reference.layout import cdiv
from blocktable.reference.pool import BlockPool, InvariantError


@dataclass
class Growth:
    """What one append did to a sequence's block list.

    `cow` is the (src, dst) pair when the last block was shared and got copied; the
    table row must then be replaced, since an entry changed. `new` are the blocks
    appended after it.
    """

    cow: tuple[int, int] | None = None
    new: list[int] = field(default_factory=list)


class SequenceBlocks:
    def __init__(self, pool: BlockPool, tokens_per_block: int, group: int = 0) -> None:
        if type(tokens_per_block) is not int or tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
        if type(group) is not int or group < 0:
            raise ValueError(f"group must be an int >= 0, got {group!r}")
        self.pool = pool
        self.tokens_per_block = tokens_per_block
        self.group = group  # part of every cache key: groups share the pool, never a key
        self.blocks: dict[int, list[int]] = {}  # live sequences only
        self.num_tokens: dict[int, int] = {}  # live and preempted: tokens that have a slot
        self.preempted: set[int] = set()
        self.cow_pairs: list[tuple[int, int]] = []  # since the last take_cow_pairs()
        # Prefix caching only: each live or preempted sequence's token ids, one per slot.
        self.tokens: dict[int, list[int]] = {}

    # -- queries ---------------------------------------------------------------------

    def live_tables(self) -> list[list[int]]:
        return list(self.blocks.values())

    def is_live(self, seq: int) -> bool:
        return seq in self.blocks

    def _need_live(self, seq: int, what: str) -> None:
        if seq in self.preempted:
            raise ValueError(f"{what}: sequence {seq} is preempted")
        if seq not in self.blocks:
            raise ValueError(f"{what}: sequence {seq} is not live (never added, or freed)")

    def check_new(self, seq: int, what: str) -> None:
        """Refuse a sequence id that is live or preempted here."""
        if seq in self.num_tokens:
            raise ValueError(f"{what}: sequence {seq} already exists")

    def _tokens(self, tokens: Sequence[int] | None, count: int, what: str) -> list[int] | None:
        """The ids of `count` tokens that get slots: required with prefix caching; with
        it off, checked if given and then dropped (nothing is keyed)."""
        if tokens is None:
            if self.pool.prefix_caching:
                raise ValueError(f"{what}: prefix caching needs the ids of the tokens that get slots")
            return None
        tokens = token_ids(tokens, count, what)
        return tokens if self.pool.prefix_caching else None

    def blocks_needed(self, seq: int, n: int) -> int:
        """Fresh blocks an append of n tokens takes, the copy-on-write block included."""
        have = self.num_tokens[seq]
        total = cdiv(have + n, self.tokens_per_block) - cdiv(have, self.tokens_per_block)
        if n > 0 and self._last_block_shared_and_partial(seq):
            total += 1
        return total

    def _last_block_shared_and_partial(self, seq: int) -> bool:
        blocks = self.blocks[seq]
        partial = self.num_tokens[seq] % self.tokens_per_block != 0
        return bool(blocks) and partial and bool(self.pool.ref[blocks[-1]] > 1)

    # -- operations ------------------------------------------------------------------

    def add(self, seq: int, num_tokens: int, tokens: Sequence[int] | None = None, computed: int = 0) -> list[int]:
        """A new sequence with slots for num_tokens tokens; returns its row.

        With prefix caching, `tokens` are their ids, and the first `computed` of them
        (a multiple of S, every block cached) are a lookup's hits: the row starts with
        the first block under each of their keys, touched, and fresh blocks follow.
        Full fresh blocks then go into the cache map."""
        self.check_new(seq, "add")
        if type(num_tokens) is not int or num_tokens < 0:
            raise ValueError(f"add: token count must be an int >= 0, got {num_tokens!r}")
        tokens = self._tokens(tokens, num_tokens, "add")
        S = self.tokens_per_block
        if type(computed) is not int or not 0 <= computed <= num_tokens or computed % S:
            raise ValueError(f"add: computed must be a multiple of {S} in [0, {num_tokens}], got {computed!r}")
        if computed and not self.pool.prefix_caching:
            raise ValueError("add: prefix caching is off, so no token is computed ahead")
        hits = []
        for j in range(computed // S):
            assert tokens is not None  # computed > 0 needs prefix caching, which needs the tokens
            b = self.pool.first_cached(block_key(self.group, tokens, j, S))
            if b is None:
                raise ValueError(f"add: logical block {j} of the prefix is not cached in group {self.group}")
            hits.append(b)
        fresh = cdiv(num_tokens, S) - len(hits)
        queued = sum(1 for b in hits if self.pool.ref[b] == 0)
        if hits and fresh > self.pool.num_free - queued:
            after = " once its hits leave the free queue" if queued else ""
            raise ValueError(f"cannot allocate {fresh} blocks: only {self.pool.num_free - queued} are free{after}")
        if hits:
            self.pool.touch(hits)
        ids = hits + self.pool.allocate(fresh)
        self.blocks[seq] = list(ids)
        self.num_tokens[seq] = num_tokens
        if tokens is not None:
            self.tokens[seq] = tokens
            self._cache_full_blocks(seq, len(hits))
        return ids

    def _cache_full_blocks(self, seq: int, first: int) -> None:
        """docs/contract.md §8: every block from logical block `first` on that is full and not
        cached yet goes under its key, in logical order."""
        S = self.tokens_per_block
        blocks, tokens = self.blocks[seq], self.tokens[seq]
        for j in range(first, self.num_tokens[seq] // S):
            if not self.pool.is_cached(blocks[j]):
                self.pool.cache_block(block_key(self.group, tokens, j, S), blocks[j])

    def append(self, seq: int, n: int, tokens: Sequence[int] | None = None) -> Growth:
        """Slots for n more tokens: copy-on-write first if the last block is shared and
        not full, then as many fresh blocks as the new tokens overflow into. With
        prefix caching, `tokens` are their ids; blocks that become full are cached."""
        self._need_live(seq, "append")
        if type(n) is not int or n < 0:
            raise ValueError(f"append: token count must be an int >= 0, got {n!r}")
        tokens = self._tokens(tokens, n, "append")
        need = self.blocks_needed(seq, n)
        if need > self.pool.num_free:
            raise ValueError(f"append: sequence {seq} needs {need} blocks, only {self.pool.num_free} free")
        growth = Growth()
        if n == 0:
            return growth
        blocks = self.blocks[seq]
        if self._last_block_shared_and_partial(seq):
            src = blocks[-1]
            [dst] = self.pool.allocate(1)
            self.cow_pairs.append((src, dst))
            self.pool.ref[src] -= 1  # stays >= 1: it was shared
            blocks[-1] = dst
            growth.cow = (src, dst)
        have = self.num_tokens[seq]
        extra = cdiv(have + n, self.tokens_per_block) - cdiv(have, self.tokens_per_block)
        growth.new = self.pool.allocate(extra)
        blocks.extend(growth.new)
        self.num_tokens[seq] = have + n
        if tokens is not None:
            self.tokens[seq] += tokens
            self._cache_full_blocks(seq, have // self.tokens_per_block)
        return growth

    def fork(self, parent: int, child: int) -> list[int]:
        """The child's list is the parent's; each distinct block's ref rises by one."""
        self._need_live(parent, "fork")
        self.check_new(child, "fork")
        blocks = self.blocks[parent]
        self.pool.share(list(dict.fromkeys(blocks)))
        self.blocks[child] = list(blocks)
        self.num_tokens[child] = self.num_tokens[parent]
        if parent in self.tokens:
            self.tokens[child] = list(self.tokens[parent])
        return list(blocks)

    def _release(self, seq: int) -> None:
        # Last block first; a block listed twice in one table is released once.
        self.pool.free(list(dict.fromkeys(reversed(self.blocks[seq]))))
        del self.blocks[seq]

    def free(self, seq: int) -> None:
        """The sequence finished (or was aborted while preempted)."""
        if seq in self.preempted:
            self.preempted.discard(seq)
        else:
            self._need_live(seq, "free")
            self._release(seq)
        del self.num_tokens[seq]
        self.tokens.pop(seq, None)

    def preempt(self, seq: int) -> None:
        """Recompute-style preemption: give every block back, remember the length."""
        self._need_live(seq, "preempt")
        self._release(seq)
        self.preempted.add(seq)

    def resume(self, seq: int) -> list[int]:
        """A fresh allocation for the remembered length; the row is replaced, not appended.
        With prefix caching its full blocks are cached like any that became full
        (`blocktable.reference.prefix.resume_request` looks the prefix up instead)."""
        if seq not in self.preempted:
            raise ValueError(f"resume: sequence {seq} is not preempted")
        ids = self.pool.allocate(cdiv(self.num_tokens[seq], self.tokens_per_block))
        self.preempted.discard(seq)
        self.blocks[seq] = list(ids)
        if seq in self.tokens:
            self._cache_full_blocks(seq, 0)
        return ids

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        pairs, self.cow_pairs = self.cow_pairs, []
        return pairs

    def check_invariants(self) -> None:
        self.pool.check_invariants(self.live_tables())
        self.check_cache_keys()

    def check_cache_keys(self) -> None:
        """docs/contract.md §8 seen from the tables: in a live sequence, every full block is
        cached under exactly that sequence's key for it (it became full, was inserted,
        and a block in use is never evicted), and a partial block is not cached."""
        if not self.pool.prefix_caching:
            return
        under = {b: key for key, blocks in self.pool.cached.items() for b in blocks}
        S = self.tokens_per_block
        for seq, blocks in self.blocks.items():
            full = self.num_tokens[seq] // S
            for j, b in enumerate(blocks):
                want = block_key(self.group, self.tokens[seq], j, S) if j < full else None
                if under.get(b) != want:
                    state = "not cached" if b not in under else "cached under another prefix" if want else "cached"
                    raise InvariantError("cache-key-matches-table", b,
                                         f"block {b}, logical block {j} ({'full' if want else 'partial'}) of "
                                         f"sequence {seq} in group {self.group}, is {state}")
