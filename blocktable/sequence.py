"""Per-sequence block lists of one KV-cache group over a pool: beam-search forks,
copy-on-write, finish and preempt/resume (docs/contract.md §6).

A block id covers `tokens_per_block` tokens (K, or K * W for a group sharded over W
DCP ranks). Appending into a last block that is partly filled and shared copies it
first: the pair (src, dst) is queued for the device, and the row must then be
replaced rather than appended to, since one of its entries changed.
"""

from __future__ import annotations

from typing import NamedTuple

from blocktable.pool import BlockPool


class Growth(NamedTuple):
    cow: tuple[int, int] | None  # (src, dst) when the last block was copied
    new: list[int]  # blocks appended after it


def _blocks_for(tokens: int, per_block: int) -> int:
    return -(-tokens // per_block)


class SequenceBlocks:
    def __init__(self, pool: BlockPool, tokens_per_block: int) -> None:
        if not isinstance(tokens_per_block, int) or tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
        self.pool = pool
        self.tokens_per_block = tokens_per_block
        self.blocks: dict[int, list[int]] = {}  # live
        self.num_tokens: dict[int, int] = {}  # live and preempted
        self.preempted: set[int] = set()
        self._pending_copies: list[tuple[int, int]] = []

    def live_tables(self) -> list[list[int]]:
        return list(self.blocks.values())

    def is_live(self, seq: int) -> bool:
        return seq in self.blocks

    def _live(self, seq: int, what: str) -> list[int]:
        if seq in self.blocks:
            return self.blocks[seq]
        state = "preempted" if seq in self.preempted else "not live (never added, or freed)"
        raise ValueError(f"{what}: sequence {seq} is {state}")

    def _absent(self, seq: int, what: str) -> None:
        if seq in self.num_tokens:
            raise ValueError(f"{what}: sequence {seq} already exists")

    @staticmethod
    def _count(n: object, what: str) -> int:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{what}: token count must be an int >= 0, got {n!r}")
        return n

    def _copy_needed(self, seq: int) -> bool:
        blocks = self.blocks[seq]
        return bool(blocks) and self.num_tokens[seq] % self.tokens_per_block != 0 \
            and self.pool.ref[blocks[-1]] > 1

    def blocks_needed(self, seq: int, n: int) -> int:
        have = self.num_tokens[seq]
        grow = _blocks_for(have + n, self.tokens_per_block) - _blocks_for(have, self.tokens_per_block)
        return grow + (1 if n and self._copy_needed(seq) else 0)

    def add(self, seq: int, num_tokens: int) -> list[int]:
        self._absent(seq, "add")
        num_tokens = self._count(num_tokens, "add")
        ids = self.pool.allocate(_blocks_for(num_tokens, self.tokens_per_block))
        self.blocks[seq] = ids
        self.num_tokens[seq] = num_tokens
        return list(ids)

    def append(self, seq: int, n: int) -> Growth:
        blocks = self._live(seq, "append")
        n = self._count(n, "append")
        need = self.blocks_needed(seq, n)
        if need > self.pool.num_free:
            raise ValueError(f"append: sequence {seq} needs {need} blocks, only {self.pool.num_free} free")
        if n == 0:
            return Growth(None, [])
        cow = None
        if self._copy_needed(seq):
            src = blocks[-1]
            dst = self.pool.allocate(1)[0]
            self.pool.unshare(src)
            blocks[-1] = dst
            cow = (src, dst)
            self._pending_copies.append(cow)
        have = self.num_tokens[seq]
        new = self.pool.allocate(_blocks_for(have + n, self.tokens_per_block) - _blocks_for(have, self.tokens_per_block))
        blocks += new
        self.num_tokens[seq] = have + n
        return Growth(cow, new)

    def fork(self, parent: int, child: int) -> list[int]:
        blocks = self._live(parent, "fork")
        self._absent(child, "fork")
        self.pool.share(sorted(set(blocks)))
        self.blocks[child] = list(blocks)
        self.num_tokens[child] = self.num_tokens[parent]
        return list(blocks)

    def _give_back(self, seq: int) -> None:
        last_first: list[int] = []
        seen: set[int] = set()
        for b in reversed(self.blocks[seq]):
            if b not in seen:
                seen.add(b)
                last_first.append(b)
        self.pool.free(last_first)
        del self.blocks[seq]

    def free(self, seq: int) -> None:
        if seq in self.preempted:
            self.preempted.remove(seq)
        else:
            self._live(seq, "free")
            self._give_back(seq)
        del self.num_tokens[seq]

    def preempt(self, seq: int) -> None:
        self._live(seq, "preempt")
        self._give_back(seq)
        self.preempted.add(seq)

    def resume(self, seq: int) -> list[int]:
        if seq not in self.preempted:
            raise ValueError(f"resume: sequence {seq} is not preempted")
        ids = self.pool.allocate(_blocks_for(self.num_tokens[seq], self.tokens_per_block))
        self.preempted.remove(seq)
        self.blocks[seq] = ids
        return list(ids)

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        pairs, self._pending_copies = self._pending_copies, []
        return pairs
