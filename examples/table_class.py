"""A multi-group block table written against blocktable's V1 table protocol
(docs/plugins.md, "Class plug-ins"): numpy host rows, a committed torch copy, and
a slot mapping in plain torch (no Triton), one object per DCP rank.

    blocktable fuzz --table examples/table_class.py:NumpyTable --minutes 1

It is kept short, not fast: every group is its own small loop of numpy and torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

INT32_MAX = 2**31 - 1


class _Group:
    """One KV-cache group's rows: allocation blocks of K tokens, each P kernel blocks of B."""

    def __init__(self, max_num_reqs, max_model_len, max_tokens, device, K, B, W, I):
        self.K, self.B, self.W, self.I, self.P = K, B, W, I, K // B
        blocks = math.ceil(max_model_len / (K * W))
        align = 128 // math.gcd(128, K)  # vLLM's alignment of a row (docs/contract.md §2)
        self.width = math.ceil(blocks / align) * align * self.P
        self.host = np.zeros((max_num_reqs, self.width), dtype=np.int32)
        self.count = np.zeros(max_num_reqs, dtype=np.int32)
        self.device = torch.zeros((max_num_reqs, self.width), dtype=torch.int32, device=device)
        self.slots = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)

    def kernel_ids(self, ids):
        """Allocation block ids -> kernel block ids b*P .. b*P+P-1, each checked."""
        for b in ids:
            if b < 0 or b * self.P + self.P - 1 > INT32_MAX:
                raise ValueError(f"block id {b} does not fit in an int32 kernel id")
        return [b * self.P + j for b in ids for j in range(self.P)]

    def slot_mapping(self, num_reqs, query_start_loc, positions, rank):
        """docs/contract.md §4 for every token at once; -1 for tokens another rank keeps,
        columns past the row, and the tail."""
        T = positions.numel()
        token = torch.arange(T, device=positions.device)
        ends = query_start_loc[1:num_reqs + 1].to(torch.int64)
        request = torch.searchsorted(ends, token, right=True)
        p = positions
        if self.W == 1:
            local = torch.ones_like(p, dtype=torch.bool)
            column, offset = p // self.B, p % self.B
        else:
            VB = self.K * self.W
            within = p % VB  # the position inside its virtual block
            local = (within // self.I) % self.W == rank
            kept = (within // (self.W * self.I)) * self.I + within % self.I  # its place among this rank's tokens
            column, offset = (p // VB) * self.P + kept // self.B, kept % self.B
        inside = column < self.width
        block = self.device[request, column.clamp(max=self.width - 1)].to(torch.int64)
        self.slots.fill_(-1)
        self.slots[:T] = torch.where(local & inside, block * self.B + offset, -1)


class NumpyTable:
    def __init__(self, *, max_num_reqs, max_model_len, max_num_batched_tokens, device, block_sizes,
                 kernel_block_sizes, sharded, cp_world_size, cp_rank, cp_interleave):
        self.max_num_reqs = max_num_reqs
        self.rank = cp_rank
        # An unsharded group is kept whole on every rank: one rank as far as its rows go.
        self.groups = [_Group(max_num_reqs, max_model_len, max_num_batched_tokens, device, K, B,
                              cp_world_size if s else 1, I if s else 1)
                       for K, B, s, I in zip(block_sizes, kernel_block_sizes, sharded, cp_interleave)]

    def _row(self, row, name="row"):
        if not 0 <= row < self.max_num_reqs:
            raise ValueError(f"{name} {row} is out of range [0, {self.max_num_reqs})")

    def _per_group(self, ids):
        if len(ids) != len(self.groups):
            raise ValueError(f"expected one id list per group ({len(self.groups)}), got {len(ids)}")
        return [group.kernel_ids(list(group_ids)) for group, group_ids in zip(self.groups, ids)]

    # Every check runs before any group changes, so a refused call changes nothing.

    def add_row(self, ids, row):
        self._row(row)
        kernel = self._per_group(ids)
        for group, k in zip(self.groups, kernel):
            if len(k) > group.width:
                raise ValueError(f"row {row} overflows: {len(k)} kernel blocks exceed width {group.width}")
        for group, k in zip(self.groups, kernel):
            group.host[row, :len(k)] = k
            group.count[row] = len(k)

    def append_row(self, ids, row):
        self._row(row)
        kernel = self._per_group(ids)
        for group, k in zip(self.groups, kernel):
            if group.count[row] + len(k) > group.width:
                raise ValueError(f"row {row} overflows: {group.count[row]} + {len(k)} exceed width {group.width}")
        for group, k in zip(self.groups, kernel):
            start = int(group.count[row])
            group.host[row, start:start + len(k)] = k
            group.count[row] = start + len(k)

    def clear_row(self, row):
        self._row(row)
        for group in self.groups:
            group.host[row, :group.count[row]] = 0
            group.count[row] = 0

    def move_row(self, src, dst):
        self._row(src, "src")
        self._row(dst, "dst")
        if src == dst:
            return
        for group in self.groups:
            n = int(group.count[src])
            group.host[dst, :n] = group.host[src, :n]
            group.count[dst] = n
            group.host[src, :n] = 0
            group.count[src] = 0

    def swap_row(self, a, b):
        self._row(a, "a")
        self._row(b, "b")
        for group in self.groups:
            group.host[[a, b]] = group.host[[b, a]]
            group.count[[a, b]] = group.count[[b, a]]

    def commit_block_table(self, num_reqs):
        if not 0 <= num_reqs <= self.max_num_reqs:
            raise ValueError(f"commit count {num_reqs} is out of range [0, {self.max_num_reqs}]")
        for group in self.groups:
            group.device[:num_reqs] = torch.from_numpy(group.host[:num_reqs]).to(group.device.device)

    def clear(self):
        for group in self.groups:
            group.host[:] = 0
            group.count[:] = 0
            group.device.zero_()

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        for group in self.groups:
            group.slot_mapping(num_reqs, query_start_loc, positions, self.rank if group.W > 1 else 0)

    def host_rows(self, g):
        return self.groups[g].host

    def counts(self, g):
        return self.groups[g].count

    def device_rows(self, g):
        return self.groups[g].device

    def slot_mapping(self, g):
        return self.groups[g].slots
