"""docs/contract.md §10: the argument checks of the V2 block tables (`reference/v2.py`).

Each helper returns the argument as plain Python values (ints, lists of ints) or raises;
none of them touches any state, so a call that runs all its checks first changes nothing
when one fails. Which error a bad argument gets:

- the array arguments and the counts of §10.5-§10.8: `TypeError` for the wrong kind
  (not a numpy array, wrong dtype, not 1-D, not an int), `ValueError` for a wrong value;
- `append_block_ids` (§10.3): `ValueError` for everything, kind included, because §10.3
  lists "`r` is an int" and "every id is an int" among the checks that raise it;
- construction (§10.2): `TypeError` for the wrong kind, `ValueError` for the values §10.2 lists.

Where one call has several faults, every `TypeError` check runs before any `ValueError`
check, so the error type never depends on the order the checks happen to be written in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """A Python or numpy integer. bool is an int subclass in Python but never a count or an id."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def is_sequence(value: Any) -> bool:
    """A list, tuple, range or numpy array; a string is a sequence of characters, never of ids."""
    if isinstance(value, np.ndarray):
        return value.ndim >= 1
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def count(name: str, value: Any) -> int:
    """A count argument (num_reqs_padded, n, num_tokens_padded): kind only; the caller checks its range."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def int_array(name: str, value: Any, dtypes: tuple[type, ...]) -> np.ndarray:
    """A 1-D numpy array of one of `dtypes` (§10.5 puts "not 1-D" under TypeError)."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(value).__name__}")
    if value.dtype not in [np.dtype(d) for d in dtypes]:
        allowed = " or ".join(np.dtype(d).name for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {value.dtype}")
    if value.ndim != 1:
        raise TypeError(f"{name} must be 1-D, got shape {value.shape}")
    return value


def slot_entries(idx: np.ndarray, max_num_reqs: int) -> list[int]:
    """§10.5: each entry a slot in [0, Rmax), or -1 for a dummy. Duplicates are allowed."""
    entries = [int(x) for x in idx]
    for b, r in enumerate(entries):
        if not (0 <= r < max_num_reqs or r == -1):
            raise ValueError(f"idx_mapping[{b}] = {r} is neither a slot in [0, {max_num_reqs}) nor -1")
    return entries


def block_id_lists(new_block_ids: Any, num_groups: int) -> list[list[int]]:
    """§10.3: one sequence of ints per group; only the kind and the count are checked here."""
    if not is_sequence(new_block_ids):
        raise ValueError(f"new_block_ids must be a sequence of {num_groups} id lists, "
                         f"got {type(new_block_ids).__name__}")
    if len(new_block_ids) != num_groups:
        raise ValueError(f"new_block_ids must hold one id list per group ({num_groups}), got {len(new_block_ids)}")
    lists = []
    for g, ids in enumerate(new_block_ids):
        if not is_sequence(ids):
            raise ValueError(f"new_block_ids[{g}] must be a sequence of ints, got {type(ids).__name__}")
        for b in ids:
            if not is_int(b):
                raise ValueError(f"block id of group {g} must be an int, got {type(b).__name__} {b!r}")
        lists.append([int(b) for b in ids])
    return lists


def config_ints(name: str, values: Any) -> list[int]:
    """A per-group list of sizes at construction (§10.2): kind only."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list, got {type(values).__name__}")
    for v in values:
        if not is_int(v):
            raise TypeError(f"{name} entries must be ints, got {type(v).__name__} {v!r}")
    return [int(v) for v in values]


def config_flags(name: str, values: Any, num_groups: int) -> list[bool]:
    """A per-group list of flags at construction (§10.2); None means True for every group."""
    if values is None:
        return [True] * num_groups
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list, got {type(values).__name__}")
    for v in values:
        if not is_bool(v):
            raise TypeError(f"{name} entries must be bools, got {type(v).__name__} {v!r}")
    return [bool(v) for v in values]


def config_int(name: str, value: Any) -> int:
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)
