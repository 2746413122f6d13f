"""vLLM's V2 block tables (docs/contract.md §10): persistent slot-indexed rows on the
device, host-side staging, one launch to apply the staged writes, a gather into
batch order and the slot mappings of every group in one launch.

The three device operations are plug-ins with the signatures of
docs/plugins.md ("vLLM's V2 block tables"), collected in a `V2Kernels`; ours (`TRITON_KERNELS`,
blocktable.kernels.v2) by default, the torch-native twins in blocktable.v2_torch.
They trust their arguments: `BlockTables` checks every call first
(blocktable.v2_checks), and a rejected call changes nothing.

triton is imported only with the kernels, after the backend is chosen (blocktable/device.py):
importing it earlier, before TRITON_INTERPRET is set, breaks the interpreter for every kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from blocktable.checks import data_checks_enabled
from blocktable.device import Backend, check_tensor, current, to_host, upload
from blocktable.v2_checks import (
    check_append,
    check_config,
    check_count,
    check_data,
    check_idx_mapping,
)

TILE = 1024  # tokens, or counts, per program iteration; the column tile is at most this
PAD_SLOT_ID = -1


@dataclass(frozen=True)
class V2Kernels:
    """The three device operations of docs/contract.md §10.10 (signatures: docs/plugins.md)."""
    append: Callable
    gather: Callable
    slot_mappings: Callable


# ---- our Triton kernels behind the plug-in signatures ----------------------------------

@functools.lru_cache(maxsize=64)
def _cached_table(device: torch.device, columns: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    backend = Backend("cuda" if device.type == "cuda" else "interpreter", device)
    return upload(torch.tensor(columns, dtype=torch.int64).reshape(len(columns), -1), backend)


def group_table(device: torch.device, *columns: Sequence[int]) -> torch.Tensor:
    """int64 [len(columns), G] on the device: one row per per-group quantity (pointers,
    strides, widths, sizes). Its content is a function of the numbers alone, so the
    upload is kept for calls that pass the same ones (a persistent table's calls)."""
    return _cached_table(device, tuple(tuple(int(v) for v in column) for column in columns))


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.numel() == 0 or t.stride(0) == 1 else t.contiguous()


NARROW_COLUMNS = 128


def _columns(widths: Sequence[int]) -> int:
    """The column tile: NARROW_COLUMNS where every row fits in it, else TILE. Two
    sizes, not one per power of two: each is a compilation, and a fuzzing run meets
    every width; a program's cost is its launch, not its masked lanes."""
    return NARROW_COLUMNS if max(widths, default=0) <= NARROW_COLUMNS else TILE


def _check_rows(name: str, tables: Sequence[torch.Tensor]) -> None:
    for g, t in enumerate(tables):
        if t.dim() != 2 or t.dtype != torch.int32 or (t.numel() and t.stride(1) != 1):
            raise ValueError(f"{name}[{g}] must be int32 [rows, width] with contiguous columns, "
                             f"got {t.dtype} {tuple(t.shape)} strides {t.stride()}")


def append_triton(rows: Sequence[torch.Tensor], cnt_dev: torch.Tensor, cnt: torch.Tensor,
                  staged_group: torch.Tensor, staged_row: torch.Tensor, staged_start: torch.Tensor,
                  staged_ids: torch.Tensor, cu_staged: torch.Tensor) -> None:
    """Every staged write in staging order (later wins), then cnt_dev = cnt: one launch."""
    G = len(rows)
    if G == 0:
        return
    _check_rows("rows", rows)
    S, Rmax = staged_group.numel(), cnt_dev.shape[1]
    grid = (S + -(-(G * Rmax) // TILE),)
    if grid[0] == 0:
        return
    table = group_table(cnt_dev.device, [t.data_ptr() for t in rows], [t.stride(0) for t in rows],
                        [t.shape[1] for t in rows])
    from blocktable.kernels.v2 import append_block_ids

    append_block_ids[grid](table[0], table[1], table[2], G, Rmax, _contiguous(staged_group),
                           _contiguous(staged_row), _contiguous(staged_start), _contiguous(staged_ids),
                           _contiguous(cu_staged), S, cnt, cnt.stride(0), cnt.stride(1), cnt_dev,
                           cnt_dev.stride(0), cnt_dev.stride(1), TILE=TILE, COLS=_columns([t.shape[1] for t in rows]))


def gather_triton(rows: Sequence[torch.Tensor], cnt_dev: torch.Tensor, inp: Sequence[torch.Tensor],
                  idx_mapping: torch.Tensor, num_reqs_padded: int) -> None:
    """inp[g][:num_reqs_padded] from rows in batch order (§10.5): one launch."""
    G = len(rows)
    if G == 0 or num_reqs_padded == 0:
        return
    _check_rows("rows", rows)
    _check_rows("inp", inp)
    table = group_table(cnt_dev.device, [t.data_ptr() for t in rows], [t.stride(0) for t in rows],
                        [t.shape[1] for t in rows], [t.data_ptr() for t in inp], [t.stride(0) for t in inp],
                        [t.shape[1] for t in inp])
    from blocktable.kernels.v2 import gather_block_tables

    gather_block_tables[(num_reqs_padded, G)](
        table[0], table[1], table[2], table[3], table[4], table[5], cnt_dev.shape[1], cnt_dev, cnt_dev.stride(0),
        cnt_dev.stride(1), _contiguous(idx_mapping), idx_mapping.numel(),
        COLS=_columns([t.shape[1] for t in inp]))


def slot_mappings_triton(rows: Sequence[torch.Tensor], idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                         positions: torch.Tensor, slots: torch.Tensor, num_tokens_padded: int, *,
                         kv_block_sizes: Sequence[int], kernel_block_sizes: Sequence[int],
                         sharded: Sequence[bool], enabled: Sequence[bool], cp_world_size: int, cp_rank: int,
                         cp_interleave: int) -> None:
    """slots[g, :] for every group (§10.7), all Tmax columns: one launch."""
    G = len(rows)
    if G == 0:
        return
    _check_rows("rows", rows)
    table = group_table(slots.device, [t.data_ptr() for t in rows], [t.stride(0) for t in rows],
                        [t.shape[1] for t in rows], kv_block_sizes, kernel_block_sizes,
                        [int(bool(s)) for s in sharded], [int(bool(e)) for e in enabled])
    from blocktable.kernels.v2 import compute_slot_mappings

    N = idx_mapping.numel()
    compute_slot_mappings[(N + 1, G)](
        table[0], table[1], table[2], table[3], table[4], table[5], table[6], _contiguous(idx_mapping),
        _contiguous(query_start_loc), _contiguous(positions), slots, slots.stride(0), slots.stride(1), N,
        slots.shape[1], cp_world_size, cp_rank, cp_interleave, TILE=TILE)


TRITON_KERNELS = V2Kernels(append=append_triton, gather=gather_triton, slot_mappings=slot_mappings_triton)


# ---- the device state -----------------------------------------------------------------

class BlockTables:
    """§10's BlockTables: `rows`, `cnt` (host), `cnt_dev`, `staged`, `inp`, `slots`."""

    def __init__(self, block_sizes: Sequence[int], max_num_reqs: int, max_num_batched_tokens: int,
                 max_num_blocks_per_group: Sequence[int], kernel_block_sizes: Sequence[int] | None = None,
                 cp_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1,
                 dcp_sharded: Sequence[bool] | None = None, slot_mapping_enabled: Sequence[bool] | None = None,
                 *, backend: Backend | None = None, kernels: V2Kernels | None = None) -> None:
        config = check_config(block_sizes, max_num_reqs, max_num_batched_tokens, max_num_blocks_per_group,
                              kernel_block_sizes, cp_size, cp_rank, cp_interleave, dcp_sharded,
                              slot_mapping_enabled)
        if kernels is not None and not isinstance(kernels, V2Kernels):
            raise TypeError(f"kernels must be a V2Kernels, got {type(kernels).__name__}")
        self.config = config
        self.backend = backend or current()
        self.kernels = kernels or TRITON_KERNELS
        self.num_groups = config.num_groups
        self.block_sizes = config.block_sizes
        self.kernel_block_sizes = config.kernel_block_sizes
        self.kernel_blocks_per_block = config.kernel_blocks_per_block
        self.widths = config.widths
        self.sharded = config.sharded
        self.enabled = config.enabled
        self.max_num_reqs = config.max_num_reqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.cp_size, self.cp_rank, self.cp_interleave = config.cp_size, config.cp_rank, config.cp_interleave

        device, G, Rmax = self.backend.device, self.num_groups, self.max_num_reqs
        self.rows: list[torch.Tensor] = [torch.zeros((Rmax, w), dtype=torch.int32, device=device)
                                         for w in self.widths]
        self.cnt = np.zeros((G, Rmax), dtype=np.int32)
        self.cnt_dev = torch.zeros((G, Rmax), dtype=torch.int32, device=device)
        self.staged: list[tuple[int, int, int, list[int]]] = []
        self.inp: list[torch.Tensor] = [torch.zeros_like(t) for t in self.rows]
        self.slots = torch.zeros((G, self.max_num_batched_tokens), dtype=torch.int64, device=device)

    # -- §10.3, §10.4 -------------------------------------------------------------------

    def append_block_ids(self, r: int, new_block_ids: Sequence[Sequence[int]], overwrite: bool) -> None:
        """Stage each group's expanded ids at its start (0 if overwrite, else the host
        count) and move the host count to the end; nothing reaches the device."""
        plan = check_append(self.config, self.cnt, r, new_block_ids, bool(overwrite))
        r = int(r)
        for g, (start, kernel_ids, end) in enumerate(plan):
            if kernel_ids:
                self.staged.append((g, r, start, kernel_ids))
            self.cnt[g, r] = end

    def apply_staged_writes(self) -> None:
        """Every staged write lands in staging order, then cnt_dev = cnt (a snapshot):
        one upload of the writes and counts, one launch for all groups."""
        if self.num_groups == 0:
            self.staged.clear()
            return
        S = len(self.staged)
        lengths = np.array([len(ids) for _, _, _, ids in self.staged], dtype=np.int64)
        cu = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(lengths, out=cu[1:])
        ids = [i for _, _, _, kernel_ids in self.staged for i in kernel_ids]
        packed = np.concatenate([
            np.array([[g, r, start] for g, r, start, _ in self.staged], dtype=np.int64).reshape(S, 3).T.reshape(-1),
            cu, np.array(ids, dtype=np.int64), self.cnt.reshape(-1)]).astype(np.int32)
        device = upload(torch.from_numpy(packed), self.backend)
        E = len(ids)
        group, row, start = device[:S], device[S:2 * S], device[2 * S:3 * S]
        cu_staged, staged_ids = device[3 * S:4 * S + 1], device[4 * S + 1:4 * S + 1 + E]
        cnt = device[4 * S + 1 + E:].view(self.num_groups, self.max_num_reqs)
        self.kernels.append(self.rows, self.cnt_dev, cnt, group, row, start, staged_ids, cu_staged)
        self.staged.clear()

    # -- §10.5, §10.6 -------------------------------------------------------------------

    def gather_block_tables(self, idx_mapping: torch.Tensor, num_reqs_padded: int) -> tuple[torch.Tensor, ...]:
        """inp[g][b] = the row of slot idx[b] (its first cnt_dev entries; the rest
        stale), zeros for -1 and b >= N; returns views inp[g][:num_reqs_padded]."""
        N = check_idx_mapping(idx_mapping, self.backend)
        n = check_count("num_reqs_padded", num_reqs_padded, self.max_num_reqs)
        if N > n:
            raise ValueError(f"idx_mapping holds {N} requests, more than num_reqs_padded {n}")
        if data_checks_enabled() and N:
            check_data(idx_mapping, self.max_num_reqs)
        if self.num_groups:
            self.kernels.gather(self.rows, self.cnt_dev, self.inp, idx_mapping, n)
        return tuple(t[:n] for t in self.inp)

    def get_dummy_block_tables(self, n: int) -> tuple[torch.Tensor, ...]:
        """inp[g][:n] = 0 for every group; returns those views (for CUDA-graph capture)."""
        n = check_count("n", n, self.max_num_reqs)
        for t in self.inp:
            t[:n].zero_()
        return tuple(t[:n] for t in self.inp)

    # -- §10.7, §10.8 -------------------------------------------------------------------

    def compute_slot_mappings(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                              positions: torch.Tensor, num_tokens_padded: int) -> torch.Tensor:
        """slots[g, :T] from rows (by slot), -1 past T in every group; returns the view
        slots[:, :num_tokens_padded]."""
        N = check_idx_mapping(idx_mapping, self.backend)
        check_tensor("query_start_loc", query_start_loc, torch.int32, 1, self.backend)
        check_tensor("positions", positions, torch.int64, 1, self.backend)
        n = check_count("num_tokens_padded", num_tokens_padded, self.max_num_batched_tokens)
        if query_start_loc.numel() < N + 1:
            raise ValueError(f"query_start_loc holds {query_start_loc.numel()} entries; {N} requests need {N + 1}")
        if data_checks_enabled():
            check_data(idx_mapping, self.max_num_reqs, query_start_loc, positions, n)
        if self.num_groups:
            self.kernels.slot_mappings(
                self.rows, idx_mapping, query_start_loc, positions, self.slots, n,
                kv_block_sizes=list(self.block_sizes), kernel_block_sizes=list(self.kernel_block_sizes),
                sharded=list(self.sharded), enabled=list(self.enabled), cp_world_size=self.cp_size,
                cp_rank=self.cp_rank, cp_interleave=self.cp_interleave)
        return self.slots[:, :n]

    def get_dummy_slot_mappings(self, n: int) -> torch.Tensor:
        """The whole slots buffer = -1 (every group, all Tmax columns); returns slots[:, :n]."""
        n = check_count("n", n, self.max_num_batched_tokens)
        self.slots.fill_(PAD_SLOT_ID)
        return self.slots[:, :n]

    # -- observing ------------------------------------------------------------------------

    def state_snapshot(self) -> dict:
        """Host copies of every array of §10.9, brought back in one transfer."""
        G = self.num_groups
        host = to_host([*self.rows, self.cnt_dev, *self.inp, self.slots])
        return {"rows": [a.copy() for a in host[:G]], "cnt": self.cnt.copy(), "cnt_dev": host[G].copy(),
                "staged": [(g, r, s, list(ids)) for g, r, s, ids in self.staged],
                "inp": [a.copy() for a in host[G + 1:2 * G + 1]], "slots": host[-1].copy()}
