"""docs/contract.md §8: prefix caching's keys, and the lookup and admission that span
the KV-cache groups.

A request's blocks exist once per group (one SequenceBlocks per group, every group on
one pool). The cache map lives on the pool and every key names its group, so one
lookup covers all groups:

1. `find_prefix` computes L: the largest length that is a multiple of every group's S,
   at most len(tokens) - 1, with every logical block below L cached in every group.
2. `add_request` touches every group's hit blocks (group by group, block by block)
   and only then allocates the fresh blocks of every group. Allocating one group's
   blocks before touching another's could evict a block the lookup counted on.

Keys are blocktable.reference.keys's: the whole prefix as a tuple, plus the group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from blocktable.reference.keys import block_key, token_ids
from blocktable.reference.layout import cdiv
from blocktable.reference.sequence import SequenceBlocks


def check_groups(groups: Sequence[SequenceBlocks], what: str) -> None:
    """One request's groups: at least one, all on one pool, each a distinct group index."""
    if not groups:
        raise ValueError(f"{what}: no KV-cache groups given")
    if any(seqs.pool is not groups[0].pool for seqs in groups):
        raise ValueError(f"{what}: the groups must share one pool")
    indices = [seqs.group for seqs in groups]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{what}: group indices {indices} are not distinct")


def find_prefix(groups: Sequence[SequenceBlocks], tokens: Sequence[int]) -> int:
    """L for a request with these tokens (docs/contract.md §8's lookup); 0 with prefix
    caching off."""
    check_groups(groups, "find_prefix")
    tokens = token_ids(tokens, None, "find_prefix")
    pool = groups[0].pool
    if not pool.prefix_caching or not tokens:
        return 0
    L = len(tokens) - 1  # at least one token is always computed
    for seqs in groups:
        S = seqs.tokens_per_block
        j = 0  # this group's logical blocks 0 .. j-1 are cached
        while (j + 1) * S <= L and pool.first_cached(block_key(seqs.group, tokens, j, S)) is not None:
            j += 1
        L = min(L, j * S)
    # Every group has its blocks below L cached; the largest multiple of every S
    # that does not exceed L keeps that true.
    step = math.lcm(*(seqs.tokens_per_block for seqs in groups))
    return L // step * step


def _hits(groups: Sequence[SequenceBlocks], tokens: list[int], L: int) -> list[list[int | None]]:
    """Each group's hit blocks: the first block under each key below L."""
    pool = groups[0].pool
    return [[pool.first_cached(block_key(s.group, tokens, j, s.tokens_per_block))
             for j in range(L // s.tokens_per_block)] for s in groups]


def _plan(groups: Sequence[SequenceBlocks], tokens: list[int], num_new: int | None,
          what: str) -> tuple[int, int, int]:
    """(L, slots, need): the hit length, the tokens that get a slot, and the blocks the
    admission takes from the free queue: every group's fresh blocks plus the hits that
    sit in the queue now (ref 0), which touching takes out of it."""
    L = find_prefix(groups, tokens)
    if num_new is None:
        num_new = len(tokens) - L
    if type(num_new) is not int or num_new < 0 or L + num_new > len(tokens):
        raise ValueError(f"{what}: num_new must be an int in [0, {len(tokens) - L}] "
                         f"(tokens past the hit length {L}), got {num_new!r}")
    slots = L + num_new
    pool = groups[0].pool
    queued_hits = sum(1 for hits in _hits(groups, tokens, L) for b in hits if pool.ref[b] == 0)
    fresh = sum(cdiv(slots, s.tokens_per_block) - L // s.tokens_per_block for s in groups)
    return L, slots, fresh + queued_hits


def blocks_to_add(groups: Sequence[SequenceBlocks], tokens: Sequence[int], num_new: int | None = None) -> int:
    """How many free-queue blocks `add_request` with these arguments would take."""
    check_groups(groups, "blocks_to_add")
    return _plan(groups, token_ids(tokens, None, "blocks_to_add"), num_new, "blocks_to_add")[2]


def add_request(groups: Sequence[SequenceBlocks], seq: int, tokens: Sequence[int],
                num_new: int | None = None) -> tuple[int, list[list[int]]]:
    """Admit sequence `seq` in every group: look up L, touch every group's hits, then give
    fresh blocks to the tokens in [L, L + num_new) (all the rest by default). Returns L
    and each group's row. Positions [0, L) are computed already: the first step
    schedules L onwards. A refused call (a bad argument, too few free blocks) changes
    nothing."""
    check_groups(groups, "add")
    tokens = token_ids(tokens, None, "add")
    for s in groups:
        s.check_new(seq, "add")
    L, slots, need = _plan(groups, tokens, num_new, "add")
    pool = groups[0].pool
    if need > pool.num_free:
        raise ValueError(f"add: sequence {seq} needs {need} free blocks (fresh ones and cached ones to revive), "
                         f"only {pool.num_free} are free")
    # Every group's hits first (each group's add of L tokens, all computed, allocates
    # nothing), then every group's fresh blocks.
    for s in groups:
        s.add(seq, L, tokens[:L], computed=L)
    for s in groups:
        s.append(seq, slots - L, tokens[L:slots])
    return L, [list(s.blocks[seq]) for s in groups]


def resume_request(groups: Sequence[SequenceBlocks], seq: int,
                   num_new: int | None = None) -> tuple[int, list[list[int]]]:
    """Resume a preempted sequence as vLLM does with prefix caching: as a new request with
    the tokens it had slots for, looked up again (its own blocks, freed last block
    first, are often still cached). The plain `SequenceBlocks.resume` allocates afresh."""
    check_groups(groups, "resume")
    for s in groups:
        if seq not in s.preempted:
            raise ValueError(f"resume: sequence {seq} is not preempted in group {s.group}")
    pool = groups[0].pool
    if not pool.prefix_caching:
        raise ValueError("resume: resuming through a lookup needs prefix caching")
    tokens = list(groups[0].tokens[seq])
    if any(s.tokens[seq] != tokens for s in groups):
        raise ValueError(f"resume: the groups hold different tokens for sequence {seq}")
    need = _plan(groups, tokens, num_new, "resume")[2]
    if need > pool.num_free:
        raise ValueError(f"resume: sequence {seq} needs {need} free blocks, only {pool.num_free} are free")
    for s in groups:
        s.free(seq)  # a preempted sequence holds no blocks: this only forgets it
    return add_request(groups, seq, tokens, num_new)
