"""Torch-native versions of §10's three device operations (docs/contract.md §10.10), with
the plug-in signatures of docs/plugins.md ("vLLM's V2 block tables"): indexing ops over every token,
entry or row at once (loops over groups only). The benchmark's baseline and a second
implementation for the tests; like the Triton kernels they trust their arguments.

`TORCH_KERNELS` plugs them into `blocktable.v2.BlockTables(kernels=...)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blocktable.v2 import V2Kernels


def append_torch(rows: Sequence[torch.Tensor], cnt_dev: torch.Tensor, cnt: torch.Tensor,
                 staged_group: torch.Tensor, staged_row: torch.Tensor, staged_start: torch.Tensor,
                 staged_ids: torch.Tensor, cu_staged: torch.Tensor) -> None:
    """Expand the writes to one entry per id, keep the last write of each (group, row,
    column) (a stable sort by target: later ids come later), scatter per group."""
    G = len(rows)
    if G == 0:
        return
    S, E = staged_group.numel(), staged_ids.numel()
    if S and E:
        device = staged_ids.device
        cu = cu_staged.to(torch.int64)
        write = torch.repeat_interleave(torch.arange(S, device=device), cu[1:] - cu[:-1], output_size=E)
        g = staged_group.to(torch.int64)[write]
        r = staged_row.to(torch.int64)[write]
        col = staged_start.to(torch.int64)[write] + torch.arange(E, device=device) - cu[write]
        width = max(t.shape[1] for t in rows)
        target = (g * cnt_dev.shape[1] + r) * width + col
        order = torch.sort(target, stable=True).indices
        ordered = target[order]
        last = torch.ones(E, dtype=torch.bool, device=device)
        last[:-1] = ordered[1:] != ordered[:-1]
        win = order[last]
        g, r, col, ids = g[win], r[win], col[win], staged_ids[win]
        for group, table in enumerate(rows):
            mine = (g == group) & (r >= 0) & (r < table.shape[0]) & (col >= 0) & (col < table.shape[1])
            table[r[mine], col[mine]] = ids[mine].to(table.dtype)
    cnt_dev.copy_(cnt)


def gather_torch(rows: Sequence[torch.Tensor], cnt_dev: torch.Tensor, inp: Sequence[torch.Tensor],
                 idx_mapping: torch.Tensor, num_reqs_padded: int) -> None:
    """Per group: rows[idx] over the whole width, each entry kept where its column is
    below the count and the old inp entry elsewhere; zero rows for -1 and padding."""
    n = num_reqs_padded
    if len(rows) == 0 or n == 0:
        return
    device = cnt_dev.device
    N = idx_mapping.numel()
    r = torch.full((n,), -1, dtype=torch.int64, device=device)
    r[:N] = idx_mapping.to(torch.int64)
    Rmax = cnt_dev.shape[1]
    real = (r >= 0) & (r < Rmax)
    rs = torch.where(real, r, 0)
    for g, (src, dst) in enumerate(zip(rows, inp)):
        width = dst.shape[1]
        count = torch.where(real, cnt_dev[g, rs].to(torch.int64), 0).clamp(0, min(width, src.shape[1]))
        copied = count[:, None] > torch.arange(width, device=device)[None, :]
        source = (src[rs, :width] if src.shape[1] >= width
                  else torch.nn.functional.pad(src[rs], (0, width - src.shape[1])))
        gathered = torch.where(copied, source, dst[:n])
        dst[:n] = torch.where(real[:, None], gathered, torch.zeros_like(gathered))


def slot_mappings_torch(rows: Sequence[torch.Tensor], idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                        positions: torch.Tensor, slots: torch.Tensor, num_tokens_padded: int, *,
                        kv_block_sizes: Sequence[int], kernel_block_sizes: Sequence[int],
                        sharded: Sequence[bool], enabled: Sequence[bool], cp_world_size: int, cp_rank: int,
                        cp_interleave: int) -> None:
    """Every output column t < Tmax at once: its request by searchsorted over
    query_start_loc, T = qsl[N] compared on the device (no host sync)."""
    if len(rows) == 0:
        return
    device, Tmax, N = slots.device, slots.shape[1], idx_mapping.numel()
    W, R, I = cp_world_size, cp_rank, cp_interleave
    t = torch.arange(Tmax, device=device)
    qsl = query_start_loc[:N + 1].to(torch.int64)
    real = (t < qsl[N]) & (t < positions.numel()) if N else torch.zeros(Tmax, dtype=torch.bool, device=device)
    if positions.numel():
        p = positions[t.clamp(max=positions.numel() - 1)].to(torch.int64)
    else:
        p = torch.zeros(Tmax, dtype=torch.int64, device=device)
    b = torch.searchsorted(qsl[1:].contiguous(), t, right=True).clamp(max=max(N - 1, 0))
    r = idx_mapping.to(torch.int64)[b] if N else torch.full((Tmax,), -1, dtype=torch.int64, device=device)
    for g, row_table in enumerate(rows):
        if not enabled[g]:
            slots[g].fill_(-1)
            continue
        K, B, width = kv_block_sizes[g], kernel_block_sizes[g], row_table.shape[1]
        if sharded[g] and W > 1:
            vbi, vbo = p // (K * W), p % (K * W)
            local = (vbo // I) % W == R
            lpos = vbi * K + (vbo // (W * I)) * I + vbo % I
        else:
            local, lpos = p >= 0, p
        col = lpos // B
        keep = real & local & (r >= 0) & (r < row_table.shape[0]) & (col >= 0) & (col < width)
        block = row_table[torch.where(keep, r, 0), torch.where(keep, col, 0)].to(torch.int64) if width else col
        slots[g] = torch.where(keep, block * B + lpos % B, -1)


TORCH_KERNELS = V2Kernels(append=append_torch, gather=gather_torch, slot_mappings=slot_mappings_torch)
