"""docs/contract.md §4: the slot mapping, one token at a time, in Python integers (which never wrap).

`slot_mapping` has the plug-in contract's inputs but returns its output instead of
writing one in place: the reference has no device and nothing to write into.
"""

from __future__ import annotations

import numpy as np

from blocktable.reference.layout import PAD_SLOT_ID


def check_dcp(kv_block_size: int, kernel_block_size: int, cp_world_size: int, cp_rank: int,
              cp_interleave: int) -> None:
    """The docs/contract.md §1 conditions on K, B, W, R, I, each failure naming the value."""
    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave
    for name, value in (("kv_block_size", K), ("kernel_block_size", B), ("cp_world_size", W),
                        ("cp_rank", R), ("cp_interleave", I)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if K < 1 or B < 1 or K % B != 0:
        raise ValueError(f"kv_block_size {K} must be a positive multiple of kernel_block_size {B}")
    if W < 1:
        raise ValueError(f"cp_world_size must be >= 1, got {W}")
    if not 0 <= R < W:
        raise ValueError(f"cp_rank {R} is out of range [0, {W})")
    if not (1 <= I <= K and K % I == 0):
        raise ValueError(f"cp_interleave {I} must divide kv_block_size {K} (1 <= I <= K)")


def check_inputs(query_start_loc: np.ndarray, positions: np.ndarray, block_table: np.ndarray,
                 max_num_tokens: int) -> None:
    """Bad input raises TypeError (kind) or ValueError (value), naming the offender."""
    for name, array, dtype, ndim in (("query_start_loc", query_start_loc, np.int32, 1),
                                     ("positions", positions, np.int64, 1),
                                     ("block_table", block_table, np.int32, 2)):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(array).__name__}")
        if array.dtype != dtype:
            raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {array.dtype}")
        if array.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    if len(query_start_loc) < 1:
        raise ValueError("query_start_loc must hold N+1 >= 1 entries")
    N = len(query_start_loc) - 1
    T = len(positions)
    if N > block_table.shape[0]:
        raise ValueError(f"{N} requests but the block table has only {block_table.shape[0]} rows")
    if query_start_loc[0] != 0:
        raise ValueError(f"query_start_loc[0] must be 0, got {query_start_loc[0]}")
    for r in range(N):
        if query_start_loc[r + 1] < query_start_loc[r]:
            raise ValueError(f"query_start_loc decreases at request {r}: "
                             f"{query_start_loc[r]} -> {query_start_loc[r + 1]}")
    if query_start_loc[N] != T:
        raise ValueError(f"query_start_loc[N] = {query_start_loc[N]} but there are {T} positions")
    if T > max_num_tokens:
        raise ValueError(f"{T} scheduled tokens exceed max_num_batched_tokens {max_num_tokens}")
    for t in range(T):
        if positions[t] < 0:
            raise ValueError(f"position {positions[t]} of token {t} is negative")


def owner_rank(position: int, kv_block_size: int, cp_world_size: int, cp_interleave: int) -> int:
    """The DCP rank that stores `position`, decided in allocation-block coordinates."""
    VB = kv_block_size * cp_world_size
    vbo = position % VB
    return (vbo // cp_interleave) % cp_world_size


def slot_of_position(p: int, row: np.ndarray, *, kv_block_size: int, kernel_block_size: int,
                     cp_world_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1) -> int:
    """The slot of position p for the request whose table row is `row`; -1 when not
    local to this rank or when the table column lies past the row."""
    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave
    P = K // B
    width = len(row)
    p = int(p)
    if W == 1:
        col = p // B
        offset = p % B
    else:
        VB = K * W
        vbi = p // VB
        vbo = p - vbi * VB
        local = (vbo // I) % W == R
        if not local:
            return PAD_SLOT_ID
        l = (vbo // (W * I)) * I + vbo % I
        col = vbi * P + l // B
        offset = l % B
    if col >= width:
        return PAD_SLOT_ID
    return int(row[col]) * B + offset


def slot_mapping(query_start_loc: np.ndarray, positions: np.ndarray, block_table: np.ndarray,
                 max_num_tokens: int, *, kv_block_size: int, kernel_block_size: int,
                 cp_world_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1) -> np.ndarray:
    """int64[max_num_tokens]: slot of every scheduled token, -1 where not local, past
    the row, or in the tail [T:max_num_tokens]."""
    check_dcp(kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave)
    check_inputs(query_start_loc, positions, block_table, max_num_tokens)
    out = np.full(max_num_tokens, PAD_SLOT_ID, dtype=np.int64)
    N = len(query_start_loc) - 1
    for r in range(N):
        for t in range(int(query_start_loc[r]), int(query_start_loc[r + 1])):
            out[t] = slot_of_position(
                positions[t], block_table[r], kv_block_size=kv_block_size,
                kernel_block_size=kernel_block_size, cp_world_size=cp_world_size,
                cp_rank=cp_rank, cp_interleave=cp_interleave)
    return out


def slot_mappings_all_ranks(query_start_loc: np.ndarray, positions: np.ndarray, block_table: np.ndarray,
                            max_num_tokens: int, *, kv_block_size: int, kernel_block_size: int,
                            cp_world_size: int = 1, cp_interleave: int = 1) -> np.ndarray:
    """int64[W, max_num_tokens]: `slot_mapping` for every rank R at once. A token is
    local on exactly one rank, its owner (docs/contract.md §4's `local` test is owner == R), so
    one pass fills the owner's slot and leaves -1 on every other rank."""
    W = cp_world_size
    check_dcp(kv_block_size, kernel_block_size, W, 0, cp_interleave)
    check_inputs(query_start_loc, positions, block_table, max_num_tokens)
    out = np.full((W, max_num_tokens), PAD_SLOT_ID, dtype=np.int64)
    for r in range(len(query_start_loc) - 1):
        for t in range(int(query_start_loc[r]), int(query_start_loc[r + 1])):
            owner = owner_rank(int(positions[t]), kv_block_size, W, cp_interleave)
            out[owner, t] = slot_of_position(
                positions[t], block_table[r], kv_block_size=kv_block_size, kernel_block_size=kernel_block_size,
                cp_world_size=W, cp_rank=owner, cp_interleave=cp_interleave)
    return out
