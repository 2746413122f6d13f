"""docs/contract.md §6: one KV-cache group's per-sequence block lists on top of a pool.

This is where fork (beam search), copy-on-write and preempt/resume live. A block id
covers `tokens_per_block` tokens: K for a replicated group, K * W for a sharded one
(every DCP rank keeps its own K of them under the same id).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blocktable.reference.layout import cdiv
from blocktable.reference.pool import BlockPool


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
    def __init__(self, pool: BlockPool, tokens_per_block: int) -> None:
        if type(tokens_per_block) is not int or tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
        self.pool = pool
        self.tokens_per_block = tokens_per_block
        self.blocks: dict[int, list[int]] = {}  # live sequences only
        self.num_tokens: dict[int, int] = {}  # live and preempted: tokens that have a slot
        self.preempted: set[int] = set()
        self.cow_pairs: list[tuple[int, int]] = []  # since the last take_cow_pairs()

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

    def _need_new(self, seq: int, what: str) -> None:
        if seq in self.num_tokens:
            raise ValueError(f"{what}: sequence {seq} already exists")

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

    def add(self, seq: int, num_tokens: int) -> list[int]:
        """A new sequence with slots for num_tokens tokens."""
        self._need_new(seq, "add")
        if type(num_tokens) is not int or num_tokens < 0:
            raise ValueError(f"add: token count must be an int >= 0, got {num_tokens!r}")
        ids = self.pool.allocate(cdiv(num_tokens, self.tokens_per_block))
        self.blocks[seq] = list(ids)
        self.num_tokens[seq] = num_tokens
        return ids

    def append(self, seq: int, n: int) -> Growth:
        """Slots for n more tokens: copy-on-write first if the last block is shared and
        not full, then as many fresh blocks as the new tokens overflow into."""
        self._need_live(seq, "append")
        if type(n) is not int or n < 0:
            raise ValueError(f"append: token count must be an int >= 0, got {n!r}")
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
        return growth

    def fork(self, parent: int, child: int) -> list[int]:
        """The child's list is the parent's; each distinct block's ref rises by one."""
        self._need_live(parent, "fork")
        self._need_new(child, "fork")
        blocks = self.blocks[parent]
        self.pool.share(list(dict.fromkeys(blocks)))
        self.blocks[child] = list(blocks)
        self.num_tokens[child] = self.num_tokens[parent]
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

    def preempt(self, seq: int) -> None:
        """Recompute-style preemption: give every block back, remember the length."""
        self._need_live(seq, "preempt")
        self._release(seq)
        self.preempted.add(seq)

    def resume(self, seq: int) -> list[int]:
        """A fresh allocation for the remembered length; the row is replaced, not appended."""
        if seq not in self.preempted:
            raise ValueError(f"resume: sequence {seq} is not preempted")
        ids = self.pool.allocate(cdiv(self.num_tokens[seq], self.tokens_per_block))
        self.preempted.discard(seq)
        self.blocks[seq] = list(ids)
        return ids

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        pairs, self.cow_pairs = self.cow_pairs, []
        return pairs

    def check_invariants(self) -> None:
        self.pool.check_invariants(self.live_tables())
