"""Per-sequence block lists of one KV-cache group over a pool: beam-search forks,
copy-on-write, finish and preempt/resume (docs/contract.md §6).

A block id covers `tokens_per_block` tokens (K, or K * W for a group sharded over W
DCP ranks). Appending into a last block that is partly filled and shared copies it
first: the pair (src, dst) is queued for the device, and the row must then be
replaced rather than appended to, since one of its entries changed.

With prefix caching (docs/contract.md §8) each sequence also keeps its token ids and the
chained hash of every full block, so a block that becomes full is hashed once, from
its parent's hash and its own S tokens, and inserted into the pool's cache map.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blocktable.keys import ROOT, Tokens, chain_hashes, token_ids
from blocktable.pool import BlockPool


class Growth(NamedTuple):
    cow: tuple[int, int] | None  # (src, dst) when the last block was copied
    new: list[int]  # blocks appended after it


def _blocks_for(tokens: int, per_block: int) -> int:
    return -(-tokens // per_block)


class SequenceBlocks:
    def __init__(self, pool: BlockPool, tokens_per_block: int, group: int = 0) -> None:
        if not isinstance(tokens_per_block, int) or tokens_per_block < 1:
            raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
        if not isinstance(group, int) or isinstance(group, bool) or group < 0:
            raise ValueError(f"group must be an int >= 0, got {group!r}")
        self.pool = pool
        self.tokens_per_block = tokens_per_block
        self.group = group
        self.blocks: dict[int, list[int]] = {}  # live
        self.num_tokens: dict[int, int] = {}  # live and preempted
        self.preempted: set[int] = set()
        self._pending_copies: list[tuple[int, int]] = []
        self.tokens: dict[int, list[int]] = {}  # prefix caching: live and preempted
        self._hashes: dict[int, list[bytes]] = {}  # prefix caching: one per full block

    def live_tables(self) -> list[list[int]]:
        return list(self.blocks.values())

    def is_live(self, seq: int) -> bool:
        return seq in self.blocks

    def _live(self, seq: int, what: str) -> list[int]:
        if seq in self.blocks:
            return self.blocks[seq]
        state = "preempted" if seq in self.preempted else "not live (never added, or freed)"
        raise ValueError(f"{what}: sequence {seq} is {state}")

    def check_new(self, seq: int, what: str) -> None:
        """Refuse a sequence id that is live or preempted here."""
        if seq in self.num_tokens:
            raise ValueError(f"{what}: sequence {seq} already exists")

    def _tokens(self, tokens: Tokens | None, count: int, what: str) -> np.ndarray | None:
        """Required with prefix caching; with it off, checked if given, then dropped."""
        if tokens is None:
            if self.pool.prefix_caching:
                raise ValueError(f"{what}: prefix caching needs the ids of the tokens that get slots")
            return None
        array = token_ids(tokens, count, what)
        return array if self.pool.prefix_caching else None

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

    def add(self, seq: int, num_tokens: int, tokens: Tokens | None = None, computed: int = 0) -> list[int]:
        """A new sequence with slots for num_tokens tokens; returns its row. With prefix
        caching, `tokens` are their ids and the first `computed` (a multiple of S, all
        cached) are hits: the row starts with them, touched."""
        self.check_new(seq, "add")
        num_tokens = self._count(num_tokens, "add")
        if tokens is not None or type(computed) is not int or computed or self.pool.prefix_caching:
            array = self._tokens(tokens, num_tokens, "add")
            S = self.tokens_per_block
            if not isinstance(computed, int) or isinstance(computed, bool) or not 0 <= computed <= num_tokens \
                    or computed % S:
                raise ValueError(f"add: computed must be a multiple of {S} in [0, {num_tokens}], got {computed!r}")
            if computed and not self.pool.prefix_caching:
                raise ValueError("add: prefix caching is off, so no token is computed ahead")
            if array is not None:
                return self._add_keyed(seq, num_tokens, array, computed)
        ids = self.pool.allocate(_blocks_for(num_tokens, self.tokens_per_block))
        self.blocks[seq] = ids
        self.num_tokens[seq] = num_tokens
        return list(ids)

    def _add_keyed(self, seq: int, num_tokens: int, tokens: np.ndarray, computed: int) -> list[int]:
        S, pool = self.tokens_per_block, self.pool
        hashes = chain_hashes(ROOT, tokens.tobytes(), S, self.group)
        hits = []
        for j in range(computed // S):
            b = pool.first_cached(hashes[j])
            if b is None:
                raise ValueError(f"add: logical block {j} of the prefix is not cached in group {self.group}")
            hits.append(b)
        fresh = _blocks_for(num_tokens, S) - len(hits)
        queued = int((pool.ref[hits] == 0).sum()) if hits else 0
        if hits and fresh > pool.num_free - queued:
            after = " once its hits leave the free queue" if queued else ""
            raise ValueError(f"cannot allocate {fresh} blocks: only {pool.num_free - queued} are free{after}")
        if hits:
            pool.touch(hits)
        ids = hits + pool.allocate(fresh)
        self.blocks[seq] = ids
        self.num_tokens[seq] = num_tokens
        self.tokens[seq] = tokens.tolist()
        self._hashes[seq] = hashes
        self._cache_blocks(seq, len(hits))
        return list(ids)

    def _cache_blocks(self, seq: int, first: int) -> None:
        """Full blocks from logical block `first` on that are not cached yet go under
        their keys, in logical order."""
        blocks, S = self.blocks[seq], self.tokens_per_block
        for j, h in enumerate(self._hashes[seq][first:], first):
            if not self.pool.is_cached(blocks[j]):
                self.pool.cache_block(h, blocks[j], self.group, (j + 1) * S)

    def _extend(self, seq: int, tokens: np.ndarray) -> None:
        """Appended tokens: hash the blocks they fill (each chained to the one before)."""
        have = self.tokens[seq]
        have += tokens.tolist()
        hashes, S = self._hashes[seq], self.tokens_per_block
        first = len(hashes)
        full = len(have) // S
        if full > first:
            data = np.asarray(have[first * S:full * S], dtype=np.int64).tobytes()
            hashes += chain_hashes(hashes[-1] if hashes else ROOT, data, S, self.group)
            self._cache_blocks(seq, first)

    def append(self, seq: int, n: int, tokens: Tokens | None = None) -> Growth:
        """Slots for n more tokens (copy-on-write of a shared partial last block first).
        With prefix caching, `tokens` are their ids; blocks that become full are cached."""
        blocks = self._live(seq, "append")
        n = self._count(n, "append")
        array = self._tokens(tokens, n, "append") if tokens is not None or self.pool.prefix_caching else None
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
        S = self.tokens_per_block
        new = self.pool.allocate(_blocks_for(have + n, S) - _blocks_for(have, S))
        blocks += new
        self.num_tokens[seq] = have + n
        if array is not None:
            self._extend(seq, array)
        return Growth(cow, new)

    def fork(self, parent: int, child: int) -> list[int]:
        blocks = self._live(parent, "fork")
        self.check_new(child, "fork")
        self.pool.share(sorted(set(blocks)))
        self.blocks[child] = list(blocks)
        self.num_tokens[child] = self.num_tokens[parent]
        if parent in self._hashes:
            self.tokens[child] = list(self.tokens[parent])
            self._hashes[child] = list(self._hashes[parent])
        return list(blocks)

    def _release(self, seq: int) -> None:
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
            self._release(seq)
        del self.num_tokens[seq]
        if seq in self._hashes:
            del self.tokens[seq], self._hashes[seq]

    def preempt(self, seq: int) -> None:
        self._live(seq, "preempt")
        self._release(seq)
        self.preempted.add(seq)

    def resume(self, seq: int) -> list[int]:
        if seq not in self.preempted:
            raise ValueError(f"resume: sequence {seq} is not preempted")
        ids = self.pool.allocate(_blocks_for(self.num_tokens[seq], self.tokens_per_block))
        self.preempted.remove(seq)
        self.blocks[seq] = ids
        if seq in self._hashes:
            self._cache_blocks(seq, 0)
        return list(ids)

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        pairs, self._pending_copies = self._pending_copies, []
        return pairs
