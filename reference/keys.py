"""docs/contract.md §8's keys, in their obvious form: logical block j of a group is
keyed by the group index and the whole token prefix up to the block's end, as a
tuple (memory and time linear in the prefix per key; the implementation's twin,
blocktable.keys, chains hashes instead)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Key = tuple[int, tuple[int, ...]]  # (group, tokens[0:(j + 1) * S]) of logical block j
INT64_MAX = 2**63 - 1


def block_key(group: int, tokens: Sequence[int], j: int, tokens_per_block: int) -> Key:
    """Logical block j's key: the group and the whole token prefix up to the block's end."""
    return (group, tuple(tokens[:(j + 1) * tokens_per_block]))


def token_ids(tokens: Sequence[int], count: int | None, what: str) -> list[int]:
    """Token ids as Python ints: a flat sequence of ints in [0, 2**63), `count` of them
    (any number when None). The test goes through np.asarray, as the implementation's
    does, so that both sides refuse exactly the same inputs."""
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise TypeError(f"{what}: tokens must be a flat sequence of ints, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"{what}: token ids must be ints, got {array.dtype}")
    if count is not None and array.size != count:
        raise ValueError(f"{what}: {array.size} tokens given for {count} slots")
    if array.size and (int(array.min()) < 0 or int(array.max()) > INT64_MAX):
        raise ValueError(f"{what}: token ids must lie in [0, 2**63), got {int(array.min())} .. {int(array.max())}")
    return [int(t) for t in array]
