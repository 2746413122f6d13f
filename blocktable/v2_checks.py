"""The checks of docs/contract.md §10 (vLLM's V2 block tables), all on the host and all
before anything changes or is launched. Shape, dtype, device and value checks of
the arguments are always on; the checks that read device tensors back (the entries
of idx_mapping, query_start_loc and positions) follow blocktable.checks'
`data_checks` switch, and read everything they need in one device-to-host copy.

Errors: construction raises TypeError for an argument of the wrong type and
ValueError for a wrong value; append_block_ids raises ValueError for every rule,
types included (§10.3 says so); idx_mapping of the wrong type, rank, dtype or device
is a TypeError (§10.5), a wrong entry a ValueError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from blocktable.checks import SMALL_BATCH
from blocktable.device import Backend, check_tensor, to_host

INT32_MAX = 2**31 - 1


def is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int(name: str, value: object) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _list(name: str, value: object, default: Any, n: int | None) -> list:
    if value is None:
        if n is None:
            raise TypeError(f"{name} must be a list")
        return [default] * n
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    return list(value)


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must hold bools, got {type(value).__name__} {value!r}")
    return bool(value)


@dataclass(frozen=True)
class Config:
    block_sizes: list[int]  # K_g
    kernel_block_sizes: list[int]  # B_g
    blocks_per_row: list[int]  # M_g
    sharded: list[bool]
    enabled: list[bool]
    max_num_reqs: int
    max_num_batched_tokens: int
    cp_size: int
    cp_rank: int
    cp_interleave: int

    @property
    def num_groups(self) -> int:
        return len(self.block_sizes)

    @property
    def kernel_blocks_per_block(self) -> list[int]:  # P_g
        return [K // B for K, B in zip(self.block_sizes, self.kernel_block_sizes)]

    @property
    def widths(self) -> list[int]:  # M_g * P_g
        return [M * P for M, P in zip(self.blocks_per_row, self.kernel_blocks_per_block)]


def check_config(block_sizes: object, max_num_reqs: object, max_num_batched_tokens: object,
                 max_num_blocks_per_group: object, kernel_block_sizes: object, cp_size: object,
                 cp_rank: object, cp_interleave: object, dcp_sharded: object,
                 slot_mapping_enabled: object) -> Config:
    """§10.2's construction rules; the defaults filled in (B = K, sharded, enabled)."""
    K = [_int("block_sizes entry", k) for k in _list("block_sizes", block_sizes, None, None)]
    G = len(K)
    M = [_int("max_num_blocks_per_group entry", m)
         for m in _list("max_num_blocks_per_group", max_num_blocks_per_group, None, None)]
    B = list(K) if kernel_block_sizes is None else [
        _int("kernel_block_sizes entry", b) for b in _list("kernel_block_sizes", kernel_block_sizes, None, G)]
    sharded = [_bool("dcp_sharded", s) for s in _list("dcp_sharded", dcp_sharded, True, G)]
    enabled = [_bool("slot_mapping_enabled", e) for e in _list("slot_mapping_enabled", slot_mapping_enabled, True, G)]
    lengths = {"block_sizes": G, "max_num_blocks_per_group": len(M), "kernel_block_sizes": len(B),
               "dcp_sharded": len(sharded), "slot_mapping_enabled": len(enabled)}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"the per-group lists differ in length: {lengths}")
    Rmax = _int("max_num_reqs", max_num_reqs)
    Tmax = _int("max_num_batched_tokens", max_num_batched_tokens)
    W, R, I = _int("cp_size", cp_size), _int("cp_rank", cp_rank), _int("cp_interleave", cp_interleave)
    for name, values in (("block_sizes", K), ("kernel_block_sizes", B), ("max_num_blocks_per_group", M),
                         ("max_num_reqs", [Rmax]), ("max_num_batched_tokens", [Tmax])):
        small = [v for v in values if v < 1]
        if small:
            raise ValueError(f"{name} must be >= 1, got {small[0]}")
    for g, (k, b) in enumerate(zip(K, B)):
        if k % b:
            raise ValueError(f"group {g}: block size {k} is not a multiple of kernel block size {b}")
    if W < 1:
        raise ValueError(f"cp_size must be >= 1, got {W}")
    if not 0 <= R < W:
        raise ValueError(f"cp_rank {R} is out of range [0, {W})")
    if I < 1:
        raise ValueError(f"cp_interleave must be >= 1, got {I}")
    if W > 1:
        for g, (k, s) in enumerate(zip(K, sharded)):
            if s and (I > k or k % I):
                raise ValueError(f"group {g} is sharded: cp_interleave {I} must divide its block size {k} "
                                 f"(1 <= I <= K)")
    return Config(K, B, M, sharded, enabled, Rmax, Tmax, W, R, I)


def check_append(config: Config, cnt: np.ndarray, r: object, new_block_ids: object,
                 overwrite: bool) -> list[tuple[int, list[int], int]]:
    """§10.3: per group (start, kernel ids, end), or ValueError for the first rule broken."""
    if not isinstance(r, (int, np.integer)) or isinstance(r, (bool, np.bool_)) or not 0 <= r < config.max_num_reqs:
        raise ValueError(f"row {r!r} must be an int in [0, {config.max_num_reqs})")
    row = int(r)
    G = config.num_groups
    if isinstance(new_block_ids, (str, bytes)) or not isinstance(new_block_ids, Sequence | np.ndarray):
        # §10.3: every rule of append_block_ids is a ValueError, types included.
        raise ValueError(f"new_block_ids must hold one id list per group, got {type(new_block_ids).__name__}")  # noqa: TRY004
    if len(new_block_ids) != G:
        raise ValueError(f"new_block_ids holds {len(new_block_ids)} id lists, but there are {G} groups")
    plan = []
    for g, (ids, P, width) in enumerate(zip(new_block_ids, config.kernel_blocks_per_block, config.widths)):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence | np.ndarray):
            raise ValueError(f"group {g}: block ids must be a list of ints, got {type(ids).__name__}")  # noqa: TRY004
        limit = (INT32_MAX - (P - 1)) // P  # the largest b with b*P + P - 1 <= 2**31 - 1
        for b in ids:
            if not is_int(b):
                raise ValueError(f"group {g}: block id {b!r} is not an int")
            if not 0 <= int(b) <= limit:
                raise ValueError(f"group {g}: block id {int(b)} does not fit: kernel ids b*{P}..b*{P}+{P - 1} "
                                 f"must lie in [0, 2**31-1]")
        start = 0 if overwrite else int(cnt[g, row])
        kernel = [int(b) * P + k for b in ids for k in range(P)]
        end = start + len(kernel)
        if end > width:
            raise ValueError(f"group {g}, row {row}: {start} entries + {len(kernel)} kernel blocks "
                             f"({len(ids)} allocation blocks) exceed the width {width}")
        plan.append((start, kernel, end))
    return plan


def check_idx_mapping(idx_mapping: object, backend: Backend) -> int:
    """§10.5's TypeErrors; returns N."""
    if not isinstance(idx_mapping, torch.Tensor):
        raise TypeError(f"idx_mapping must be a torch.Tensor, got {type(idx_mapping).__name__}")
    if idx_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"idx_mapping must be int32 or int64, got {idx_mapping.dtype}")
    try:
        check_tensor("idx_mapping", idx_mapping, idx_mapping.dtype, 1, backend)
    except ValueError as e:  # rank and device: §10.5 makes both a TypeError
        raise TypeError(str(e)) from None
    return idx_mapping.numel()


def check_count(name: str, value: object, limit: int) -> int:
    """An int in [0, limit], else TypeError/ValueError."""
    n = _int(name, value)
    if not 0 <= n <= limit:
        raise ValueError(f"{name} {n} is out of range [0, {limit}]")
    return n


def _first_negative(positions: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
    """On the device: the first t < T with positions[t] < 0, or len(positions) if none."""
    t = torch.arange(positions.numel(), device=positions.device)
    bad = (positions < 0) & (t < num_tokens.to(torch.int64))
    return torch.where(bad, t, positions.numel()).min().view(1)


def check_data(idx_mapping: torch.Tensor, max_num_reqs: int, query_start_loc: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, num_tokens_padded: int = 0) -> None:
    """The data-dependent rules of §10.5 (idx entries) and §10.7 (qsl, T, positions),
    from one device-to-host copy. A small positions tensor comes back whole; a
    large one sends back only its first negative entry before T."""
    N = idx_mapping.numel()
    parts = [idx_mapping]
    if query_start_loc is not None and positions is not None:
        parts.append(query_start_loc[:N + 1])
        if positions.numel() <= SMALL_BATCH:
            parts.append(positions)
        else:
            parts.append(_first_negative(positions, query_start_loc[N]))
    host = to_host(parts)
    idx = host[0].astype(np.int64)
    bad = np.flatnonzero((idx < -1) | (idx >= max_num_reqs))
    if len(bad):
        b = int(bad[0])
        raise ValueError(f"idx_mapping[{b}] = {int(idx[b])} is neither a row in [0, {max_num_reqs}) nor -1")
    if query_start_loc is None or positions is None:
        return
    qsl = host[1].astype(np.int64)
    if qsl[0] != 0:
        raise ValueError(f"query_start_loc[0] must be 0, got {int(qsl[0])}")
    falls = np.flatnonzero(qsl[1:] < qsl[:-1])
    if len(falls):
        b = int(falls[0])
        raise ValueError(f"query_start_loc decreases at request {b}: {int(qsl[b])} -> {int(qsl[b + 1])}")
    T = int(qsl[N])
    if T > num_tokens_padded:
        raise ValueError(f"T = query_start_loc[{N}] = {T} exceeds num_tokens_padded {num_tokens_padded}")
    if positions.numel() < T:
        raise ValueError(f"positions holds {positions.numel()} entries, fewer than T = {T}")
    if positions.numel() <= SMALL_BATCH:
        negative = np.flatnonzero(host[2][:T] < 0)
        first = int(negative[0]) if len(negative) else T
    else:
        first = int(host[2][0])
    if first < T:
        value = int(host[2][first]) if positions.numel() <= SMALL_BATCH else "< 0"
        raise ValueError(f"position {value} of token {first} is negative")
