"""Prefix caching's keys (docs/contract.md §8), as chained block hashes: logical
block j of a group is named by h_j = blake2b(h_{j-1} || group || tokens of block j),
16 bytes, with h_{-1} = ROOT. Equal hashes stand for equal (group, prefix) keys; a
128-bit collision is out of scope. The reference's twin is blocktable.reference.keys,
which keys blocks by the whole prefix."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

Tokens = Sequence[int] | np.ndarray  # token ids as callers hold them
ROOT = bytes(16)  # the parent hash of logical block 0
INT64_MAX = 2**63 - 1


def token_ids(tokens: Tokens, count: int | None, what: str) -> np.ndarray:
    """Token ids as an int64 array: a flat sequence of ints in [0, 2**63), `count` of
    them (any number when None)."""
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise TypeError(f"{what}: tokens must be a flat sequence of ints, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"{what}: token ids must be ints, got {array.dtype}")
    if count is not None and array.size != count:
        raise ValueError(f"{what}: {array.size} tokens given for {count} slots")
    if array.size and (int(array.min()) < 0 or int(array.max()) > INT64_MAX):
        raise ValueError(f"{what}: token ids must lie in [0, 2**63), got {int(array.min())} .. {int(array.max())}")
    return array.astype(np.int64, copy=False)


def block_hash(parent: bytes, salt: bytes, block: bytes) -> bytes:
    """One full block's key: its parent block's hash, its group (`salt`) and its own
    tokens (int64, native bytes); a hash chain makes it stand for the whole prefix."""
    return hashlib.blake2b(parent + salt + block, digest_size=16).digest()


def chain_hashes(parent: bytes, data: bytes, tokens_per_block: int, group: int) -> list[bytes]:
    """The hashes of the full blocks in `data` (int64 token ids, native bytes), the first
    chained to `parent`."""
    step = 8 * tokens_per_block
    salt = group.to_bytes(8, "little")
    out = []
    for at in range(0, len(data) - step + 1, step):
        parent = block_hash(parent, salt, data[at:at + step])
        out.append(parent)
    return out
