"""The data-level oracle on the device (docs/contract.md §7): the paged KV caches of one group's
DCP ranks, one int64 value per token slot, written through slot mappings, copied
block by block for copy-on-write, and read back through block-table rows.

The harness writes a distinct value for every (sequence, position); reading every
live sequence back must give the reference's history, whichever blocks the pool
chose. A write checks its slots on the host first (a bad slot is a clear error),
unless its caller compares them with the truth itself; either way the write skips
any slot outside the cache, so a bad slot is never a stray write on the GPU.

Two engines do the same three things: "triton" (the kernels in
blocktable.kernels.oracle; the default on a GPU) and "torch" (indexing ops; the
default under the interpreter, where each interpreted launch costs milliseconds and
the lockstep machines make several per step). BLOCKTABLE_ORACLE=triton|torch
overrides; both are proven equal to the reference's paged-cache model.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from blocktable.device import Backend, check_tensor, current, upload


class Engine(Protocol):
    """How a DeviceCache's three operations are carried out (TritonEngine, TorchEngine)."""

    def write(self, slot_mappings: torch.Tensor, values: torch.Tensor) -> None: ...

    def copy(self, ids: torch.Tensor, block_slots: int) -> None: ...

    def gather(self, table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, K: int, B: int, W: int,
               I: int) -> torch.Tensor: ...


GPU_TILE = 1024  # values a program moves on a GPU; a block copy's tile is at most this


def _tile(backend: Backend) -> int:
    # The interpreter runs one program at a time as numpy; wide programs cost little.
    return 16384 if backend.interpreted else GPU_TILE


def poison_value() -> int:
    from blocktable.kernels.oracle import POISON_VALUE

    return POISON_VALUE


def out_of_cache_value() -> int:
    from blocktable.kernels.oracle import OUT_OF_CACHE_VALUE

    return OUT_OF_CACHE_VALUE




@dataclass(frozen=True)
class Reads:
    """What to read back: row rows[i], position positions[i] for each i. Checked on
    the host and sent once (Reads.send), so that many caches can read the same list
    (every group of a lockstep step does) without a check or a copy each."""

    rows: np.ndarray  # int32 [M], on the host
    positions: np.ndarray  # int64 [M], on the host
    rows_device: torch.Tensor  # int64: sent in one copy with the positions (the kernels widen rows anyway)
    positions_device: torch.Tensor

    @classmethod
    def send(cls, rows: np.ndarray, positions: np.ndarray, backend: Backend | None = None) -> Reads:
        return cls.received(rows, positions, upload(torch.from_numpy(cls.packed(rows, positions)), backend))

    @staticmethod
    def packed(rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The reads checked, as the one int64 array that is sent: the rows, then the
        positions. A caller that uploads other arrays too sends it with them (each
        upload from pageable memory is a staging copy, a transfer and an event) and
        hands the device copy to `received`."""
        for name, array, dtype in (("rows", rows, np.int32), ("positions", positions, np.int64)):
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
                raise TypeError(f"{name} must be a 1-D {np.dtype(dtype)} array, got "
                                f"{getattr(array, 'dtype', type(array).__name__)} {getattr(array, 'shape', '')}")
        M = len(positions)
        if len(rows) != M:
            raise ValueError(f"{len(rows)} rows for {M} positions")
        if M and (rows < 0).any():
            raise ValueError("gather: row indices must be >= 0")
        if M and (positions < 0).any():
            raise ValueError("gather: positions must be >= 0")
        return np.concatenate([rows.astype(np.int64), positions])

    @classmethod
    def received(cls, rows: np.ndarray, positions: np.ndarray, sent: torch.Tensor) -> Reads:
        """The reads, given the device copy of `packed(rows, positions)`."""
        M = len(positions)
        if sent.dtype != torch.int64 or tuple(sent.shape) != (2 * M,):
            raise ValueError(f"the reads were sent as {sent.dtype} {tuple(sent.shape)}, not int64 ({2 * M},)")
        return cls(rows, positions, sent[:M], sent[M:])


class DeviceCache:
    """`ranks` caches (one per DCP rank; 1 for a replicated group) of num_slots slots
    each, holding slots [slot_base, slot_base + num_slots)."""

    def __init__(self, num_slots: int, slot_base: int = 0, ranks: int = 1, backend: Backend | None = None,
                 engine: str | None = None) -> None:
        self.backend = backend or current()
        default = "torch" if self.backend.interpreted else "triton"
        name = engine or os.environ.get("BLOCKTABLE_ORACLE", default)
        if name not in ENGINES:
            raise ValueError(f"oracle engine must be one of {', '.join(ENGINES)}, got {name!r}")
        self.engine: Engine = ENGINES[name](self)
        self.slot_base = slot_base
        self.num_slots = num_slots
        self.ranks = ranks
        self.data = torch.full((ranks, num_slots), poison_value(), dtype=torch.int64, device=self.backend.device)

    def values(self) -> np.ndarray:
        return self.data.cpu().numpy()

    def state_snapshot(self) -> dict[str, np.ndarray]:
        return {"data": self.values().copy()}

    def write(self, slot_mappings: torch.Tensor, values: torch.Tensor, check: bool = True) -> None:
        """cache[r, slot_mappings[r, t]] = values[t] for every rank r and t < len(values),
        skipping slots < 0. slot_mappings is [ranks, Tmax] (or [Tmax] for one rank).
        Checked (one device sync): a slot outside the cache, or two tokens of one rank
        in one slot, is a clear error and nothing is written. check=False is for a
        caller that compares every slot with the truth before it trusts the cache (the
        lockstep, which reads everything back once per step): no sync; a slot outside
        the cache is skipped on the device, never written, and repeated slots race."""
        if isinstance(slot_mappings, torch.Tensor) and slot_mappings.dim() == 1:
            slot_mappings = slot_mappings[None, :]
        check_tensor("slot_mappings", slot_mappings, torch.int64, 2, self.backend)
        check_tensor("values", values, torch.int64, 1, self.backend)
        if slot_mappings.shape[0] != self.ranks:
            raise ValueError(f"{slot_mappings.shape[0]} slot mappings for {self.ranks} ranks")
        T = values.numel()
        if T > slot_mappings.shape[1]:
            raise ValueError(f"{T} values but only {slot_mappings.shape[1]} slots")
        if slot_mappings.numel() and (slot_mappings.stride(1) != 1 or not values.is_contiguous()):
            raise ValueError("slot_mappings rows and values must be contiguous")
        used = slot_mappings[:, :T]
        if check:
            self._check_slots(used.cpu().numpy())
        if T:
            self.engine.write(slot_mappings, values)

    def _check_slots(self, slots: np.ndarray) -> None:
        """[ranks, T] slots on the host: every slot >= 0 inside the cache, and no rank's
        slot written twice (two tokens in one slot would race on a GPU; the
        interpreter and the model write in order: refused, as a correct step never
        does it)."""
        index = slots[slots >= 0] - self.slot_base
        outside = (index < 0) | (index >= self.num_slots)
        if outside.any():
            bad = int(index[outside][0]) + self.slot_base
            raise ValueError(f"write: slot {bad} lies outside the cache [{self.slot_base}, "
                             f"{self.slot_base + self.num_slots})")
        keyed = np.sort((np.arange(self.ranks)[:, None] * self.num_slots + slots - self.slot_base)[slots >= 0])
        repeated = keyed[1:][keyed[1:] == keyed[:-1]]
        if len(repeated):
            bad = int(repeated[0])
            raise ValueError(f"write: slot {bad % self.num_slots + self.slot_base} of rank {bad // self.num_slots} "
                             f"is written by more than one token in one call")

    def copy_blocks(self, pairs: Sequence[tuple[int, int]], block_slots: int) -> None:
        """Block src's slots over block dst's for every (src, dst) on every rank, all
        pairs at once, so no destination may also be a source."""
        if not pairs:
            return
        sources = {s for s, _ in pairs}
        for _, d in pairs:
            if d in sources:
                raise ValueError(f"copy_blocks: block {d} is both a source and a destination")
        ids = torch.tensor(pairs, dtype=torch.int64)
        for name, column in (("source", ids[:, 0]), ("destination", ids[:, 1])):
            first = column * block_slots - self.slot_base
            if bool(((first < 0) | (first + block_slots > self.num_slots)).any()):
                raise ValueError(f"copy_blocks: a {name} block lies outside the cache: {list(pairs)}")
        self.engine.copy(upload(ids, self.backend), block_slots)

    def gather(self, block_table: torch.Tensor, rows: torch.Tensor | np.ndarray, positions: torch.Tensor | np.ndarray,
               *, kv_block_size: int, kernel_block_size: int, cp_world_size: int = 1,
               cp_interleave: int = 1) -> torch.Tensor:
        """[ranks, M]: for each rank and i, the value it holds for position positions[i]
        of table row rows[i]; POISON where the rank does not hold it, OUT_OF_CACHE
        where the row points outside the cache. One rank per DCP rank of W. rows and
        positions may be host arrays (int32, int64): checked there, then sent."""
        kw = dict(kv_block_size=kv_block_size, kernel_block_size=kernel_block_size, cp_world_size=cp_world_size,
                  cp_interleave=cp_interleave)
        if isinstance(rows, np.ndarray) and isinstance(positions, np.ndarray):
            return self.read(block_table, Reads.send(rows, positions, self.backend), **kw)
        check_tensor("block_table", block_table, torch.int32, 2, self.backend)
        rows = check_tensor("rows", rows, torch.int32, 1, self.backend)
        positions = check_tensor("positions", positions, torch.int64, 1, self.backend)
        self._check_ranks(cp_world_size)
        M = len(positions)
        if len(rows) != M:
            raise ValueError(f"{len(rows)} rows for {M} positions")
        if M:
            bad_row, bad_position = torch.stack([torch.any((rows < 0) | (rows >= block_table.shape[0])),
                                                 torch.any(positions < 0)]).tolist()  # one device sync for both
            if bad_row:
                raise ValueError(f"gather: a row index lies outside the table's {block_table.shape[0]} rows")
            if bad_position:
                raise ValueError("gather: positions must be >= 0")
        return self._gather(block_table, rows, positions, **kw)

    def read(self, block_table: torch.Tensor, reads: Reads, *, kv_block_size: int, kernel_block_size: int,
             cp_world_size: int = 1, cp_interleave: int = 1) -> torch.Tensor:
        """`gather` of reads already checked and sent (Reads.send): what every group of a
        step reads, sent once. Checked against this table on the host."""
        check_tensor("block_table", block_table, torch.int32, 2, self.backend)
        self._check_ranks(cp_world_size)
        if reads.rows.size and int(reads.rows.max()) >= block_table.shape[0]:
            raise ValueError(f"gather: a row index lies outside the table's {block_table.shape[0]} rows")
        return self._gather(block_table, reads.rows_device, reads.positions_device, kv_block_size=kv_block_size,
                            kernel_block_size=kernel_block_size, cp_world_size=cp_world_size,
                            cp_interleave=cp_interleave)

    def _check_ranks(self, cp_world_size: int) -> None:
        if cp_world_size != self.ranks:
            raise ValueError(f"a cache of {self.ranks} ranks read as {cp_world_size} DCP ranks")

    def _gather(self, block_table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, *, kv_block_size: int,
                kernel_block_size: int, cp_world_size: int, cp_interleave: int) -> torch.Tensor:
        return self.engine.gather(block_table, rows, positions, kv_block_size, kernel_block_size, cp_world_size,
                                  cp_interleave)


class TritonEngine:
    """The cache's three operations as the kernels in blocktable.kernels.oracle (the
    default on a GPU)."""

    def __init__(self, cache: DeviceCache) -> None:
        self.cache = cache

    def write(self, slot_mappings: torch.Tensor, values: torch.Tensor) -> None:
        from blocktable.kernels.oracle import write_values

        c, T = self.cache, values.numel()
        tile = _tile(c.backend)
        write_values[(-(-T // tile), c.ranks)](slot_mappings, slot_mappings.stride(0), values, c.data, c.num_slots, T,
                                               c.slot_base, BLOCK=tile)

    def copy(self, ids: torch.Tensor, block_slots: int) -> None:
        from blocktable.kernels.oracle import copy_blocks

        c = self.cache
        tile = min(_tile(c.backend), 1 << max(0, (block_slots - 1).bit_length()))
        copy_blocks[(len(ids), c.ranks)](ids[:, 0].contiguous(), ids[:, 1].contiguous(), c.data, c.num_slots,
                                         block_slots, c.slot_base, BLOCK=tile)

    def gather(self, table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, K: int, B: int, W: int,
               I: int) -> torch.Tensor:
        from blocktable.kernels.oracle import gather

        c, M = self.cache, len(positions)
        out = torch.empty((c.ranks, M), dtype=torch.int64, device=c.backend.device)
        if M:
            tile = _tile(c.backend)
            gather[(-(-M // tile), c.ranks)](
                table, table.stride(0), table.shape[1], rows.contiguous(), positions.contiguous(), c.data, out, M,
                c.slot_base, c.num_slots, K, B, W, I, BLOCK=tile)
        return out


class TorchEngine:
    """The cache's three operations as torch indexing ops (the default under the
    interpreter, where each interpreted launch costs milliseconds and the lockstep
    machines make several per step)."""

    def __init__(self, cache: DeviceCache) -> None:
        self.cache = cache

    def write(self, slot_mappings: torch.Tensor, values: torch.Tensor) -> None:
        c, T = self.cache, values.numel()
        index = slot_mappings[:, :T] - c.slot_base
        keep = (index >= 0) & (index < c.num_slots)
        rank = torch.arange(c.ranks, device=index.device)[:, None].expand(-1, T)
        c.data[rank[keep], index[keep]] = values[None, :].expand(c.ranks, T)[keep]

    def copy(self, ids: torch.Tensor, block_slots: int) -> None:
        c = self.cache
        span = torch.arange(block_slots, device=ids.device)
        src = (ids[:, :1] * block_slots - c.slot_base + span).reshape(-1)
        dst = (ids[:, 1:] * block_slots - c.slot_base + span).reshape(-1)
        c.data[:, dst] = c.data[:, src]  # reads all sources before any write

    def gather(self, table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, K: int, B: int, W: int,
               I: int) -> torch.Tensor:
        c = self.cache
        width = table.shape[1]
        per_virtual_block = K * W
        within = positions % per_virtual_block
        stripe = within // I
        owner = stripe % W
        local = (stripe // W) * I + within % I
        column = (positions // per_virtual_block) * (K // B) + local // B
        in_row = column < width
        block = torch.zeros_like(positions)
        if width:
            block[in_row] = table[rows.long()[in_row], column[in_row]].long()
        index = block * B + local % B - c.slot_base
        inside = (index >= 0) & (index < c.num_slots)
        out = torch.full((c.ranks, positions.numel()), poison_value(), dtype=torch.int64, device=positions.device)
        for rank in range(c.ranks):
            mine = (owner == rank) & in_row
            value = torch.full_like(positions, out_of_cache_value())
            value[mine & inside] = c.data[rank, index[mine & inside]]
            out[rank, mine] = value[mine]
        return out


ENGINES: dict[str, Callable[[DeviceCache], Engine]] = {"triton": TritonEngine, "torch": TorchEngine}
