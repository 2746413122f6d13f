"""Input checks of the plug-in contract (docs/contract.md §4), shared by every slot-mapping
wrapper. Shape, dtype, device and configuration checks are always on; the
data-dependent ones (they read device memory back, a device sync) can be switched
off for speed: benchmarks switch them off, the stateless fuzzer runs them on every
batch, and the lockstep on a program's first call only, since its inputs are valid
by construction."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from blocktable.device import Backend, check_tensor, current, to_host

_data_checks = True


def data_checks_enabled() -> bool:
    return _data_checks


@contextlib.contextmanager
def data_checks(enabled: bool) -> Iterator[None]:
    """Switch the data-dependent input checks on or off inside a `with` block."""
    global _data_checks
    saved, _data_checks = _data_checks, enabled
    try:
        yield
    finally:
        _data_checks = saved


def _int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


def check_config(kv_block_size: int, kernel_block_size: int, cp_world_size: int, cp_rank: int,
                 cp_interleave: int) -> None:
    K, B = _int("kv_block_size", kv_block_size), _int("kernel_block_size", kernel_block_size)
    W, R, I = _int("cp_world_size", cp_world_size), _int("cp_rank", cp_rank), _int("cp_interleave", cp_interleave)
    if K < 1 or B < 1 or K % B:
        raise ValueError(f"kv_block_size {K} must be a positive multiple of kernel_block_size {B}")
    if W < 1:
        raise ValueError(f"cp_world_size must be >= 1, got {W}")
    if not 0 <= R < W:
        raise ValueError(f"cp_rank {R} is out of range [0, {W})")
    if not (1 <= I <= K and K % I == 0):
        raise ValueError(f"cp_interleave {I} must divide kv_block_size {K} (1 <= I <= K)")


def check_slot_inputs(query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                      slot_mapping: torch.Tensor, backend: Backend | None = None) -> tuple[int, int, int]:
    """Validate the four tensors; return (N, T, Tmax)."""
    backend = backend or current()
    check_tensor("query_start_loc", query_start_loc, torch.int32, 1, backend)
    check_tensor("positions", positions, torch.int64, 1, backend)
    check_tensor("block_table", block_table, torch.int32, 2, backend)
    check_tensor("slot_mapping", slot_mapping, torch.int64, 1, backend)
    if query_start_loc.numel() < 1:
        raise ValueError("query_start_loc must hold N+1 >= 1 entries")
    for name, t in (("query_start_loc", query_start_loc), ("positions", positions), ("slot_mapping", slot_mapping)):
        if t.numel() and t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous, got stride {t.stride(0)}")
    if block_table.numel() and block_table.stride(1) != 1:  # an empty table has no layout
        raise ValueError(f"block_table rows must be contiguous, got column stride {block_table.stride(1)}")
    N = query_start_loc.numel() - 1
    T = positions.numel()
    Tmax = slot_mapping.numel()
    if N > block_table.shape[0]:
        raise ValueError(f"{N} requests but the block table has only {block_table.shape[0]} rows")
    if T > Tmax:
        raise ValueError(f"{T} scheduled tokens exceed max_num_batched_tokens {Tmax}")
    if _data_checks:
        _check_data(query_start_loc, positions, N, T)
    return N, T, Tmax


SMALL_BATCH = 4096  # tokens: up to this, the positions come back whole with query_start_loc


def _check_data(query_start_loc: torch.Tensor, positions: torch.Tensor, N: int, T: int) -> None:
    # One read-back for every check, since each waits for the device; the rest on the
    # host. A small batch comes back whole (each device op costs about as much as a
    # short copy); a large one sends back only whether any position is negative.
    if T <= SMALL_BATCH:
        qsl, positions_host = to_host([query_start_loc, positions])
        any_negative = bool((positions_host < 0).any())
    else:
        qsl, flag = to_host([query_start_loc, (positions < 0).any().view(1)])
        any_negative = bool(flag[0])
    if qsl[0] != 0:
        raise ValueError(f"query_start_loc[0] must be 0, got {int(qsl[0])}")
    if N:
        falls = np.flatnonzero(qsl[1:] < qsl[:-1])
        if len(falls):
            r = int(falls[0])
            raise ValueError(f"query_start_loc decreases at request {r}: {int(qsl[r])} -> {int(qsl[r + 1])}")
    if qsl[N] != T:
        raise ValueError(f"query_start_loc[N] = {int(qsl[N])} but there are {T} positions")
    if any_negative:
        t = int(torch.nonzero(positions < 0)[0, 0])
        raise ValueError(f"position {int(positions[t])} of token {t} is negative")
