"""Prefix caching (docs/contract.md §8): the lookup and admission that span a
request's KV-cache groups.

A key is never materialized as a token prefix (blocktable/keys.py): a lookup hashes
block by block and stops at the first miss, so its cost is the hit length, not the
prompt length.

Admission touches every group's hits before it allocates any group's fresh blocks:
allocating first could evict a block that the lookup counted on in another group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from blocktable.keys import ROOT, Tokens, block_hash, chain_hashes, token_ids
from blocktable.sequence import SequenceBlocks


def check_groups(groups: Sequence[SequenceBlocks], what: str) -> None:
    if not groups:
        raise ValueError(f"{what}: no KV-cache groups given")
    if any(seqs.pool is not groups[0].pool for seqs in groups):
        raise ValueError(f"{what}: the groups must share one pool")
    indices = [seqs.group for seqs in groups]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{what}: group indices {indices} are not distinct")


def _lookup(groups: Sequence[SequenceBlocks], tokens: np.ndarray) -> int:
    pool = groups[0].pool
    if not pool.prefix_caching or not tokens.size:
        return 0
    data = tokens.tobytes()
    L = tokens.size - 1
    for seqs in groups:
        S, salt = seqs.tokens_per_block, seqs.group.to_bytes(8, "little")
        h, j = ROOT, 0
        while (j + 1) * S <= L:
            h = block_hash(h, salt, data[8 * j * S:8 * (j + 1) * S])
            if pool.first_cached(h) is None:
                break
            j += 1
        L = min(L, j * S)
    step = math.lcm(*(seqs.tokens_per_block for seqs in groups))
    return L // step * step


def find_prefix(groups: Sequence[SequenceBlocks], tokens: Tokens) -> int:
    """L: the largest multiple of every group's S, at most len(tokens) - 1, below which
    every logical block is cached in every group; 0 with prefix caching off."""
    check_groups(groups, "find_prefix")
    return _lookup(groups, token_ids(tokens, None, "find_prefix"))


def _plan(groups: Sequence[SequenceBlocks], tokens: np.ndarray, num_new: int | None,
          what: str) -> tuple[int, int, int]:
    """(L, slots, free-queue blocks taken): fresh blocks plus hits now at ref 0."""
    L = _lookup(groups, tokens)
    if num_new is None:
        num_new = tokens.size - L
    if not isinstance(num_new, int) or isinstance(num_new, bool) or num_new < 0 or L + num_new > tokens.size:
        raise ValueError(f"{what}: num_new must be an int in [0, {tokens.size - L}] "
                         f"(tokens past the hit length {L}), got {num_new!r}")
    slots = L + num_new
    need = 0
    if L:
        data = tokens[:L].tobytes()
        pool = groups[0].pool
        for seqs in groups:
            for h in chain_hashes(ROOT, data, seqs.tokens_per_block, seqs.group):
                need += int(pool.ref[pool.first_cached(h)] == 0)
    for seqs in groups:
        S = seqs.tokens_per_block
        need += -(-slots // S) - L // S
    return L, slots, need


def blocks_to_add(groups: Sequence[SequenceBlocks], tokens: Tokens, num_new: int | None = None) -> int:
    """How many free-queue blocks `add_request` with these arguments would take."""
    check_groups(groups, "blocks_to_add")
    return _plan(groups, token_ids(tokens, None, "blocks_to_add"), num_new, "blocks_to_add")[2]


def add_request(groups: Sequence[SequenceBlocks], seq: int, tokens: Tokens,
                num_new: int | None = None) -> tuple[int, list[list[int]]]:
    """Admit `seq` in every group: L, every group's hits touched, then fresh blocks for
    the tokens in [L, L + num_new) (all the rest by default). Returns L and the rows.
    A refused call changes nothing."""
    check_groups(groups, "add")
    array = token_ids(tokens, None, "add")
    for seqs in groups:
        seqs.check_new(seq, "add")
    L, slots, need = _plan(groups, array, num_new, "add")
    pool = groups[0].pool
    if need > pool.num_free:
        raise ValueError(f"add: sequence {seq} needs {need} free blocks (fresh ones and cached ones to revive), "
                         f"only {pool.num_free} are free")
    for seqs in groups:
        seqs.add(seq, L, array[:L], computed=L)
    for seqs in groups:
        seqs.append(seq, slots - L, array[L:slots])
    return L, [list(seqs.blocks[seq]) for seqs in groups]


def resume_request(groups: Sequence[SequenceBlocks], seq: int,
                   num_new: int | None = None) -> tuple[int, list[list[int]]]:
    """Resume a preempted sequence through a lookup, as a new request with the tokens it
    had slots for (vLLM's way with prefix caching)."""
    check_groups(groups, "resume")
    for seqs in groups:
        if seq not in seqs.preempted:
            raise ValueError(f"resume: sequence {seq} is not preempted in group {seqs.group}")
    pool = groups[0].pool
    if not pool.prefix_caching:
        raise ValueError("resume: resuming through a lookup needs prefix caching")
    tokens = groups[0].tokens[seq]
    if any(seqs.tokens[seq] != tokens for seqs in groups):
        raise ValueError(f"resume: the groups hold different tokens for sequence {seq}")
    array = np.asarray(tokens, dtype=np.int64)
    need = _plan(groups, array, num_new, "resume")[2]
    if need > pool.num_free:
        raise ValueError(f"resume: sequence {seq} needs {need} free blocks, only {pool.num_free} are free")
    for seqs in groups:
        seqs.free(seq)  # a preempted sequence holds no blocks: this only forgets it
    return add_request(groups, seq, array, num_new)
